"""Wire formats: test vectors, round trips over dtypes and shapes, and every malformed case."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wire import WireError, decode_message, dump_arrays, load_arrays, native, strings
from wire.dtypes import DTYPE_TO_CODE
from wire.errors import byte_view

VECTORS = json.loads((Path(__file__).resolve().parent.parent / "wire" / "vectors.json").read_text())


def frames_of(v: dict) -> list[bytes]:
    return [bytes.fromhex(f) for f in v["frames"]]


def expected_array(t: dict) -> np.ndarray:
    """A vector's tensor: its data row-major, or (dtype "bytes") each byte string in hex."""
    if t["dtype"] == "bytes":
        return strings.of(bytes.fromhex(x) for x in t["data"])
    return np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"])


def expected_arrays(v: dict) -> list[np.ndarray]:
    return [expected_array(t) for t in v["tensors"]]


@pytest.mark.parametrize("v", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vector_decodes_to_its_tensors(v):
    batch = decode_message(frames_of(v))
    want = expected_arrays(v)
    assert len(batch.arrays) == len(want)
    for got, exp in zip(batch.arrays, want):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        np.testing.assert_array_equal(got, exp)
    if v["format"] == "native":
        h = batch.header
        assert (h.producer_id, h.seq, h.send_time_ns, h.extras) == (
            v["header"]["producer_id"],
            v["header"]["seq"],
            v["header"]["send_time_ns"],
            v["header"]["extras"],
        )
    else:
        assert batch.header is None


@pytest.mark.parametrize("v", VECTORS["valid"], ids=lambda v: v["name"])
def test_encoders_give_the_vector_bytes(v):
    arrays = expected_arrays(v)
    if v["format"] == "zmq_ops":
        assert [dump_arrays(arrays)] == frames_of(v)
    else:
        hv = v["header"]
        frames = native.encode(arrays, hv["producer_id"], hv["seq"], hv["send_time_ns"], hv["extras"])
        assert [bytes(byte_view(f)) for f in frames] == frames_of(v)


def test_dump_arrays_reference_example_is_84_bytes():
    buf = dump_arrays([np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.array([7, -1], np.int32)])
    assert len(buf) == 84
    assert struct.unpack_from("=iii", buf, 0) == (2, 4, 3)  # two tensors, the first uint8 with 3 dims


def test_dump_arrays_accepts_python_numbers_like_tensorpack():
    out = load_arrays(dump_arrays([1.5, 3, np.zeros((2, 2), np.float64)]))
    assert out[0].dtype == np.float32 and out[0] == 1.5
    assert out[1].dtype == np.int32 and out[1] == 3
    assert out[2].shape == (2, 2)


@pytest.mark.parametrize("v", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector_is_rejected_naming_the_field(v):
    with pytest.raises(WireError) as e:
        decode_message(frames_of(v))
    assert e.value.field == v["field"]
    assert v["field"] in str(e.value)


def test_empty_tensor_with_impossible_dimensions_is_rejected():
    big = 2**31 - 1  # three of these multiply past what any array index can hold
    huge = struct.pack("<i", 1) + struct.pack("<iiiiii", 4, 4, 0, big, big, big) + struct.pack("<q", 0)
    with pytest.raises(WireError, match="tensor\\[0\\].shape"):
        load_arrays(huge)
    frames = native.encode([np.zeros((0, 1, 1), np.uint8)], 0, 0)
    header = bytearray(frames[0])
    struct.pack_into("<qq", header, 48, 2**62, 2**62)  # the descriptor's 2nd and 3rd dimensions
    with pytest.raises(WireError, match="tensor\\[0\\].shape"):
        decode_message([bytes(header), b""])


def test_unsupported_dtype_is_refused_when_sending():
    with pytest.raises(WireError, match="tensor\\[0\\].dtype"):
        dump_arrays([np.zeros(2, np.complex64)])
    with pytest.raises(WireError, match="tensor\\[0\\].dtype"):
        native.encode([np.array(["a"])], 0, 0)


def test_received_arrays_view_the_frames_without_copying():
    frame = bytearray(dump_arrays([np.arange(10, dtype=np.int32)]))
    (arr,) = load_arrays(frame)
    frame[-4:] = struct.pack("=i", 99)
    assert arr[-1] == 99


dtypes = st.sampled_from(sorted(DTYPE_TO_CODE, key=str))
shapes = hnp.array_shapes(min_dims=0, max_dims=8, min_side=0, max_side=4)
arrays = st.lists(dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes)), max_size=5)


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype
        and x.shape == y.shape
        and (list(x) == list(y) if strings.is_strings(x) else x.tobytes() == y.tobytes())
        for x, y in zip(a, b)
    )


@settings(max_examples=200, deadline=None)
@given(arrays)
def test_zmq_ops_format_round_trip(arrs):
    assert same(load_arrays(dump_arrays(arrs)), arrs)


@settings(max_examples=200, deadline=None)
@given(arrays, st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_native_format_round_trip(arrs, pid, seq):
    frames = native.encode(arrs, pid, seq, extras={"sent": seq})
    batch = decode_message(frames)
    assert same(batch.arrays, arrs)
    assert (batch.header.producer_id, batch.header.seq, batch.header.extras) == (pid, seq, {"sent": seq})


byte_strings = st.lists(st.binary(max_size=40), max_size=12).map(strings.of)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(byte_strings, dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes))), max_size=4))
def test_byte_strings_round_trip_beside_other_tensors(arrs):
    batch = decode_message(native.encode(arrs, 1, 2))
    assert same(batch.arrays, arrs)


@settings(max_examples=300, deadline=None)
@given(byte_strings.filter(len), st.integers(0, 2**64 - 1), st.integers(0, 7))
def test_any_wrong_length_table_is_rejected_naming_it(items, value, at):
    frames = native.encode([items], 0, 0)
    frame = bytearray(frames[1])
    k = at % len(items)
    if struct.unpack_from("<Q", frame, 8 * k)[0] == value:
        return
    struct.pack_into("<Q", frame, 8 * k, value)
    with pytest.raises(WireError) as e:
        decode_message([frames[0], bytes(frame)])
    assert e.value.field == "tensor[0].lengths"


def test_byte_strings_are_refused_where_they_cannot_travel():
    with pytest.raises(WireError, match="tensor\\[0\\].dtype"):
        dump_arrays([strings.of([b"ab"])])  # the zmq_ops format has no such type
    with pytest.raises(WireError, match="tensor\\[0\\].ndim"):
        native.encode([strings.of([b"ab", b"c"]).reshape(1, 2)], 0, 0)
    with pytest.raises(WireError, match="tensor\\[0\\].data"):
        native.encode([strings.of(["text, not bytes"])], 0, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 3))
def test_random_bytes_never_crash_the_decoder(blob, nframes):
    frames = [blob] + [blob[: i * 7] for i in range(nframes)]
    try:
        decode_message(frames)
    except WireError as e:
        assert e.field
