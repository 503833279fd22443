"""Write wire/vectors.json: byte-level test vectors for both wire formats.

The bytes are packed here field by field with `struct`, independently of the
encoders in wire/, so the Python tests and the C++ op's tests check the
encoders against the layout in docs/wire.md rather than against themselves.
Run it again only when the format changes: `python scripts/make_wire_vectors.py`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import msgpack

OUT = Path(__file__).resolve().parent.parent / "wire" / "vectors.json"
UINT8, INT32, FLOAT, INT64, BOOL, HALF = 4, 3, 1, 9, 10, 19
BYTES = 7  # a batch of byte strings: native format only (wire/strings.py)


def zt(code: int, shape: list[int], data: bytes, nbytes: int | None = None) -> bytes:
    """One tensor in zmq_ops layout (little-endian, as on every supported host)."""
    n = len(data) if nbytes is None else nbytes
    return struct.pack(f"<ii{len(shape)}i", code, len(shape), *shape) + struct.pack("<q", n) + data


def zmsg(*tensors: bytes, n: int | None = None) -> bytes:
    return struct.pack("<i", len(tensors) if n is None else n) + b"".join(tensors)


def nhead(
    descs: list[tuple[int, list[int]]],
    pid=7,
    seq=42,
    t=1_700_000_000_123_456_789,
    extras=b"",
    version=1,
    n=None,
    magic=b"FBWN",
) -> bytes:
    fixed = struct.pack("<4sHHIQqI", magic, version, len(descs) if n is None else n, pid, seq, t, len(extras))
    body = b"".join(struct.pack(f"<ii{len(s)}q", c, len(s), *s) for c, s in descs)
    return fixed + body + extras


def t(dtype: str, shape: list[int], data: list) -> dict:
    return {"dtype": dtype, "shape": shape, "data": data}


def strings_frame(items: list[bytes], lengths: list[int] | None = None) -> bytes:
    """A byte-string tensor's frame: uint64 lengths (the items' own unless given), then the bytes."""
    table = [len(b) for b in items] if lengths is None else lengths
    return struct.pack(f"<{len(table)}Q", *table) + b"".join(items)


jpegs = [b"\xff\xd8\xff\xe0JFIF", b"", b"\xff\xd9"]  # tensors of dtype "bytes" give each item in hex


ar24 = bytes(range(24))
i32 = struct.pack("<2i", 7, -1)
extras = msgpack.packb({"gen_images_per_sec": 1234.5, "sent": 3}, use_bin_type=True)

valid = [
    {
        "name": "zmq_ops: uint8 arange(24).reshape(2,3,4) and int32 [7,-1] (84 bytes)",
        "format": "zmq_ops",
        "frames": [zmsg(zt(UINT8, [2, 3, 4], ar24), zt(INT32, [2], i32))],
        "tensors": [t("uint8", [2, 3, 4], list(range(24))), t("int32", [2], [7, -1])],
    },
    {
        "name": "zmq_ops: scalar float32 1.5, empty int64 [0,3], bool [True, False]",
        "format": "zmq_ops",
        "frames": [zmsg(zt(FLOAT, [], struct.pack("<f", 1.5)), zt(INT64, [0, 3], b""), zt(BOOL, [2], b"\x01\x00"))],
        "tensors": [t("float32", [], 1.5), t("int64", [0, 3], []), t("bool", [2], [True, False])],
    },
    {"name": "zmq_ops: no tensors", "format": "zmq_ops", "frames": [zmsg()], "tensors": []},
    {
        "name": "native: uint8 arange(24).reshape(2,3,4) and int32 [7,-1]",
        "format": "native",
        "frames": [nhead([(UINT8, [2, 3, 4]), (INT32, [2])]), ar24, i32],
        "header": {"producer_id": 7, "seq": 42, "send_time_ns": 1_700_000_000_123_456_789, "extras": {}},
        "tensors": [t("uint8", [2, 3, 4], list(range(24))), t("int32", [2], [7, -1])],
    },
    {
        "name": "native: float16 [2] with producer telemetry in extras",
        "format": "native",
        "frames": [nhead([(HALF, [2])], pid=1, seq=0, t=5, extras=extras), struct.pack("<2e", 0.5, -2.0)],
        "header": {"producer_id": 1, "seq": 0, "send_time_ns": 5, "extras": {"gen_images_per_sec": 1234.5, "sent": 3}},
        "tensors": [t("float16", [2], [0.5, -2.0])],
    },
    {
        "name": "native: byte strings [ffd8ffe04a464946, (empty), ffd9] and int32 labels [3, 1, 4]",
        "format": "native",
        "frames": [nhead([(BYTES, [3]), (INT32, [3])]), strings_frame(jpegs), struct.pack("<3i", 3, 1, 4)],
        "header": {"producer_id": 7, "seq": 42, "send_time_ns": 1_700_000_000_123_456_789, "extras": {}},
        "tensors": [t("bytes", [3], [b.hex() for b in jpegs]), t("int32", [3], [3, 1, 4])],
    },
    {
        "name": "native: no byte strings",
        "format": "native",
        "frames": [nhead([(BYTES, [0])]), b""],
        "header": {"producer_id": 7, "seq": 42, "send_time_ns": 1_700_000_000_123_456_789, "extras": {}},
        "tensors": [t("bytes", [0], [])],
    },
]

u8 = zt(UINT8, [2, 3, 4], ar24)
s3 = strings_frame(jpegs)
invalid = [
    ("zmq_ops", [b"\x01\x00"], "n_tensors", "shorter than the tensor count"),
    ("zmq_ops", [zmsg(u8, n=2)], "tensor[1].dtype", "one tensor declared too many"),
    ("zmq_ops", [zmsg(u8, n=-1)], "n_tensors", "negative count"),
    ("zmq_ops", [zmsg(zt(99, [2], b"ab"))], "tensor[0].dtype", "unknown dtype code"),
    ("zmq_ops", [zmsg(zt(UINT8, [1] * 9, b"a"))], "tensor[0].ndim", "ndim 9 > 8"),
    ("zmq_ops", [zmsg(zt(UINT8, [-2], b""))], "tensor[0].shape[0]", "negative dimension"),
    ("zmq_ops", [zmsg(zt(UINT8, [2, 3, 4], ar24, nbytes=23))], "tensor[0].nbytes", "nbytes disagrees with shape"),
    ("zmq_ops", [zmsg(u8)[:-5]], "tensor[0].data", "data truncated"),
    ("zmq_ops", [zmsg(u8) + b"xyz"], "message", "trailing bytes"),
    ("native", [nhead([(UINT8, [2, 3, 4])])[:20], ar24], "header", "fixed part truncated"),
    ("native", [nhead([(UINT8, [2, 3, 4])], magic=b"XXXX"), ar24], "magic", "wrong magic"),
    ("native", [nhead([(UINT8, [2, 3, 4])], version=9), ar24], "version", "unknown version"),
    ("native", [nhead([(UINT8, [2, 3, 4]), (INT32, [2])]), ar24], "frames", "one data frame missing"),
    ("native", [nhead([(77, [2])]), b"ab"], "tensor[0].dtype", "unknown dtype code"),
    ("native", [nhead([(UINT8, [1] * 9)]), b"a"], "tensor[0].ndim", "ndim 9 > 8"),
    ("native", [nhead([(UINT8, [-1])]), b""], "tensor[0].shape[0]", "negative dimension"),
    ("native", [nhead([(UINT8, [2, 3, 4])]), ar24[:-1]], "tensor[0].nbytes", "frame shorter than shape"),
    ("native", [nhead([(UINT8, [2, 3, 4])], n=2), ar24], "tensor[1].dtype", "header truncated in descriptors"),
    ("native", [nhead([(UINT8, [2, 3, 4])]) + b"\x00", ar24], "extras_len", "extra byte after header"),
    ("native", [nhead([(BYTES, [3])]), s3[:20]], "tensor[0].lengths", "byte strings: length table truncated"),
    ("native", [nhead([(BYTES, [3])]), s3[:-1]], "tensor[0].lengths", "byte strings: lengths exceed the frame"),
    ("native", [nhead([(BYTES, [3])]), s3 + b"x"], "tensor[0].lengths", "byte strings: bytes after the last"),
    (
        "native",
        [nhead([(BYTES, [2])]), strings_frame(jpegs[:2], [2**64 - 1, 9])],
        "tensor[0].lengths",
        "byte strings: lengths overflow 64 bits",
    ),  # fmt: skip
    ("native", [nhead([(UINT8, [2, 3, 4]), (BYTES, [1, 3])]), ar24, s3], "tensor[1].ndim", "byte strings: 2 dims"),
    ("zmq_ops", [zmsg(zt(BYTES, [3], s3))], "tensor[0].dtype", "byte strings are native-only"),
]


def main() -> None:
    doc = {
        "about": "Test vectors for docs/wire.md. Frames are hex; tensors give dtype, shape and "
        "row-major data. Invalid vectors give the field the receiver's error must name.",
        "valid": [{**v, "frames": [f.hex() for f in v["frames"]]} for v in valid],
        "invalid": [
            {"name": f"{fmt}: {why}", "format": fmt, "frames": [f.hex() for f in frames], "field": field}
            for fmt, frames, field, why in invalid
        ],
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} ({len(valid)} valid, {len(invalid)} invalid)")


if __name__ == "__main__":
    main()
