"""The ROI JPEG decoder: same pixels as a full decode, same crops as the old decoder, odd and hostile files."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image
from scipy import stats

from consumers.zmq_pull import PullConsumer
from core.images import decoders
from core.images.jpeg_roi import MAX_CROP_PIXELS, RoiDecodeError, RoiDecoder, halve, max_memory
from producers.cold_cache import drop_pages, resident_share
from producers.commands import producer_command
from producers.dataset import make_dataset, make_imagenet_like
from producers.decode import DecodeSource

pytestmark = pytest.mark.timeout(180)


def made(tmp_path_factory, make, **kw) -> Path:
    root = tmp_path_factory.mktemp(make.__name__)
    make(root, **kw)
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return made(tmp_path_factory, make_dataset, classes=2, per_class=4, seed=5)


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory) -> Path:
    """30 files: every odd kind of the ImageNet-like set is among them."""
    return made(tmp_path_factory, make_imagenet_like, classes=2, per_class=15, seed=2)


def gradient_jpeg(path: Path, width: int, height: int, **save) -> None:
    """Red rises left to right, green top to bottom: a crop's place can be read off its pixels."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    img = np.stack([x, y, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    Image.fromarray(img).save(path, "JPEG", quality=95, **save)


@pytest.fixture(scope="module")
def gradients(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gradients")
    sizes = [(500, 375), (375, 500), (500, 333), (640, 480), (1100, 800), (300, 220)]
    for c in range(2):
        (root / f"c{c}").mkdir()
        for k, (w, h) in enumerate(sizes):
            gradient_jpeg(root / f"c{c}" / f"g{k}.JPEG", w, h, subsampling=2 * (k % 2))
    return root


def full_then_roi(dec: RoiDecoder, data: bytes, denom: int, rows, cols, fast: bool) -> tuple[np.ndarray, np.ndarray]:
    hd = dec.header(data)
    whole = dec.decode(denom, (0, -(-hd.height // denom)), (0, -(-hd.width // denom)), fast).copy()
    dec.header(data)
    roi = dec.decode(denom, rows, cols, fast).copy()
    return whole, roi


@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_roi_decode_is_the_full_decode_cut(photos, denom):
    dec = RoiDecoder()
    for f in sorted(photos.rglob("*.JPEG")):
        data = f.read_bytes()
        hd = dec.header(data)
        h, w = -(-hd.height // denom), -(-hd.width // denom)
        rows, cols = (h // 5, h // 5 + h // 2), (w // 3 + 1, w // 3 + 1 + w // 2)
        whole, roi = full_then_roi(dec, data, denom, rows, cols, fast=True)
        assert roi.shape == (rows[1] - rows[0], cols[1] - cols[0], 3)
        np.testing.assert_array_equal(roi, whole[rows[0] : rows[1], cols[0] : cols[1]], err_msg=f.name)


def test_exact_mode_roi_stays_within_a_step_of_the_full_decode(photos):
    # Fancy upsampling may differ at the cropped edge by a rounding step; nothing more.
    dec = RoiDecoder()
    data = sorted(photos.rglob("*.JPEG"))[0].read_bytes()
    whole, roi = full_then_roi(dec, data, 1, (33, 200), (101, 300), fast=False)
    diff = np.abs(roi.astype(int) - whole[33:200, 101:300].astype(int))
    assert diff.max() <= 3 and diff.mean() < 0.05


def crop_places(root: Path, decoder: str, seed: int, batches: int = 8) -> np.ndarray:
    """(centre x, centre y, width share, height share, flipped) of each output image, read off its gradients."""
    source = DecodeSource(str(root), None, batch=24, image_size=64, seed=seed, decoder=decoder, fallback=False)
    it = source(0)
    rows = []
    for _ in range(batches):
        images, _ = next(it)
        for img in images.astype(np.float64) / 255:
            red, green = img[..., 0], img[..., 1]
            flipped = red[:, -8:].mean() < red[:, :8].mean()
            rows.append([red.mean(), green.mean(), np.ptp(red.mean(0)), np.ptp(green.mean(1)), flipped])
    return np.array(rows)


def test_roi_crops_are_the_old_decoders_crops(gradients):
    old, new = crop_places(gradients, "simplejpeg", seed=3), crop_places(gradients, "roi", seed=3)
    # Same seed, same draws: every image shows the same place of its file, flipped the same way.
    np.testing.assert_array_equal(old[:, 4], new[:, 4])
    assert np.abs(old[:, :4] - new[:, :4]).max() < 0.03


def test_roi_crops_follow_the_old_decoders_distribution(gradients):
    old, new = crop_places(gradients, "simplejpeg", seed=11), crop_places(gradients, "roi", seed=12)
    for k, what in enumerate(["centre x", "centre y", "width share", "height share", "flip"]):
        p = stats.ks_2samp(old[:, k], new[:, k]).pvalue
        assert p > 0.01, f"{what}: the ROI decoder's crops differ in distribution (KS p={p:.4f})"
    assert 0.35 < new[:, 4].mean() < 0.65


def test_every_odd_file_is_decoded_or_named_bad(imagenet_like):
    manifest = json.loads((imagenet_like / "MANIFEST.json").read_text())
    kinds = {v["kind"] for v in manifest.values()}
    assert kinds == {"plain", "grayscale", "progressive", "cmyk", "png"}
    out = np.empty((64, 64, 3), np.uint8)
    for name, info in manifest.items():
        data = (imagenet_like / name).read_bytes()
        if info["kind"] == "png":
            with pytest.raises(decoders.NotJpegError, match="not a JPEG but PNG"):
                decoders.DECODERS["roi"](data, random.Random(0), out)
            continue
        decoders.DECODERS["roi"](data, random.Random(0), out)
        assert out.std() > 3, f"{name} ({info['kind']}) decoded to a blank image"
        if info["kind"] == "grayscale":
            assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()


def test_cmyk_file_matches_pillows_colours(tmp_path):
    path = tmp_path / "cmyk.jpg"
    gradient_jpeg(path, 200, 150)
    Image.open(path).convert("CMYK").save(path, "JPEG", quality=95)
    data = path.read_bytes()
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    dec = RoiDecoder()
    assert dec.header(data).colour_space == "CMYK"
    got = dec.decode(1, (0, 150), (0, 200), fast=False)
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 2


def test_producer_counts_the_png_as_bad_with_its_reason(procs, ipc_dir, imagenet_like):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        cmd = producer_command("decode", endpoint, 8, 64, str(imagenet_like), 1, count=8)
        p = procs.start(*cmd[1:])
        batches = [c.recv() for _ in range(8)]  # 64 images from 29 good files: every file is tried
    assert p.wait(60) == 0, p.stderr.read()
    err = p.stderr.read()
    png = next(k for k, v in json.loads((imagenet_like / "MANIFEST.json").read_text()).items() if v["kind"] == "png")
    assert batches[-1].header.extras["bad_files"] == 1
    assert f"{png}: not a JPEG but PNG" in err, err
    stages = batches[-1].header.extras["stage_ms"]
    assert set(stages) <= set(decoders.STAGES) and stages["rows"] > 0 and stages["resize"] > 0


def test_truncated_and_corrupt_files_are_refused_with_the_reason(photos):
    data = sorted(photos.rglob("*.JPEG"))[0].read_bytes()
    dec = RoiDecoder()
    hd = dec.header(data)
    dec.header(data[: len(data) // 2])
    with pytest.raises(RoiDecodeError, match="Premature end"):
        dec.decode(1, (0, hd.height), (0, hd.width))
    corrupt = bytearray(data)
    corrupt[len(data) // 2 : len(data) // 2 + 64] = b"\xff\x00" * 32
    corrupt[len(data) // 3 : len(data) // 3 + 8] = b"\xff\xd9\xff\xd9\x00\x00\xff\xc4"
    dec.header(bytes(corrupt))
    with pytest.raises(RoiDecodeError):
        dec.decode(1, (0, hd.height), (0, hd.width))
    with pytest.raises(RoiDecodeError, match="not a JPEG"):
        dec.header(b"GIF89a" + data)
    # The context is fine afterwards.
    dec.header(data)
    assert dec.decode(2, (0, 10), (0, 10)).shape == (10, 10, 3)


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    """A 16384x16384 baseline JPEG and a 12000x12000 progressive one (grey: small files, quick to make)."""
    root = tmp_path_factory.mktemp("huge")
    img = Image.linear_gradient("L").resize((16384, 16384), Image.Resampling.NEAREST)
    img.save(root / "16k.jpg", "JPEG", quality=80)
    img.resize((12000, 12000), Image.Resampling.NEAREST).save(root / "12k-progressive.jpg", "JPEG", progressive=True)
    return root


def test_16k_file_is_decoded_with_bounded_memory(procs, huge):
    # In a fresh process: its peak resident memory shows what decoding the file cost.
    script = (
        "import random, resource, sys, numpy as np\n"
        "from core.images.decoders import DECODERS\n"
        "data = open(sys.argv[1], 'rb').read(); out = np.empty((224, 224, 3), np.uint8)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "rng = random.Random(0)\n"
        "for _ in range(int(sys.argv[2])): DECODERS['roi'](data, rng, out)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, int(out.std() > 1))\n"
    )
    p = procs.start("-c", script, str(huge / "16k.jpg"), "4")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    grown_kib, varied = map(int, out.split())
    # A full decode would need 768 MiB for its RGB output alone.
    assert grown_kib < 160 * 1024, f"decoding a 16k x 16k file grew the process by {grown_kib // 1024} MiB"
    assert varied


def test_progressive_file_beyond_the_memory_bound_is_refused(huge):
    dec = RoiDecoder()
    data = (huge / "12k-progressive.jpg").read_bytes()
    hd = dec.header(data)
    assert hd.progressive and (hd.width, hd.height) == (12000, 12000)
    with pytest.raises(RoiDecodeError, match=f"12000x12000 needs .* over the {max_memory() >> 20} MiB bound"):
        dec.decode(8, (0, 100), (0, 100))


def test_crop_beyond_the_buffer_bound_is_refused(huge):
    dec = RoiDecoder()
    dec.header((huge / "16k.jpg").read_bytes())
    with pytest.raises(RoiDecodeError, match=f"over the {MAX_CROP_PIXELS >> 20} Mpixel bound"):
        dec.decode(1, (0, 16384), (0, 16384))


def test_producer_skips_the_refused_file_and_decodes_the_huge_one(procs, ipc_dir, tmp_path, huge, photos):
    data = tmp_path / "ds"
    shutil.copytree(photos / "n00000000", data / "a")
    shutil.copy(huge / "16k.jpg", data / "a" / "16k.jpg")
    shutil.copy(huge / "12k-progressive.jpg", data / "a" / "12k-progressive.jpg")
    assert "12k-progressive.jpg: progressive JPEG of 12000x12000 needs" in one_bad_file_run(procs, ipc_dir, data)


def one_bad_file_run(procs, ipc_dir, data: Path) -> str:
    """3 batches of 64 decoded from the folder `data` by a producer process: its stderr, after checking that
    it counted one bad file."""
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = procs.start(*producer_command("decode", endpoint, 6, 64, str(data), 1, count=3)[1:])
        batches = [c.recv() for _ in range(3)]
    assert p.wait(60) == 0
    assert batches[-1].header.extras["bad_files"] == 1
    return p.stderr.read()


def on_tmpfs(path: Path) -> bool:
    """Whether `path` is on a tmpfs (whose pages cannot be dropped: they are the file)."""
    best, fstype = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        mount, kind = line.split()[1], line.split()[2]
        if str(path).startswith(mount) and len(mount) > len(best):
            best, fstype = mount, kind
    return fstype == "tmpfs"


def test_cold_cache_drops_pages_and_leaves_files_unchanged(photos):
    files = sorted(photos.rglob("*.JPEG"))
    before = {f: (f.read_bytes(), os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files}
    assert resident_share(files) == 1.0  # just read
    assert drop_pages(files) == sum(v[2] for v in before.values())
    if not on_tmpfs(photos):
        assert resident_share(files) == 0.0
    for f, (blob, mtime, _) in before.items():
        assert os.stat(f).st_mtime_ns == mtime and f.read_bytes() == blob


def test_producer_cold_cache_run_delivers_and_changes_nothing(procs, ipc_dir, photos):
    files = sorted(photos.rglob("*.JPEG"))
    before = {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in files}
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = procs.start(
            *producer_command("decode", endpoint, 4, 64, str(photos), 1, count=2, extra=["--cold-cache"])[1:]
        )
        batches = [c.recv() for _ in range(2)]
    assert p.wait(60) == 0, p.stderr.read()
    assert all(b.arrays[0].std() > 5 for b in batches)
    assert "read" in batches[-1].header.extras["stage_ms"]
    assert {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in files} == before


def test_one_decoder_reused_over_many_files_and_crops_stays_exact(photos, gradients):
    # One context per thread decodes file after file, cropped, skipped and abandoned part-way:
    # nothing of one file's decode may leak into the next.
    files = sorted([*photos.rglob("*.JPEG"), *gradients.rglob("*.JPEG")])
    rng = random.Random(7)
    reused = RoiDecoder()
    for _ in range(400):
        f = rng.choice(files)
        data, denom = f.read_bytes(), rng.choice([1, 2, 4, 8])
        fresh = RoiDecoder()
        hd = fresh.header(data)
        h, w = -(-hd.height // denom), -(-hd.width // denom)
        whole = fresh.decode(denom, (0, h), (0, w))
        y0, x0 = rng.randrange(h), rng.randrange(w)
        rows, cols = (y0, rng.randrange(y0 + 1, h + 1)), (x0, rng.randrange(x0 + 1, w + 1))
        reused.header(data)
        got = reused.decode(denom, rows, cols)
        want = whole[rows[0] : rows[1], cols[0] : cols[1]]
        np.testing.assert_array_equal(got, want, err_msg=f"{f.name} at 1/{denom}, rows {rows}, columns {cols}")


@pytest.fixture(scope="module")
def progressive(photos) -> dict[str, bytes]:
    """Progressive photographs: 4:2:0 (its chroma needs AC scans at 1/8 scale), 4:4:4, and grayscale."""
    img = Image.open(sorted(photos.rglob("*.JPEG"))[0]).convert("RGB").resize((333, 251))
    out = {}
    for name, im, save in [("420", img, {"subsampling": 2}), ("444", img, {"subsampling": 0}), ("grey", img, {})]:
        buf = io.BytesIO()
        (im.convert("L") if name == "grey" else im).save(buf, "JPEG", quality=90, progressive=True, **save)
        out[name] = buf.getvalue()
    return out


def scans(data: bytes) -> list[tuple[int, int, int]]:
    """(first byte of the entropy-coded data, spectral start, first component id) of each scan of a JPEG."""
    found, i = [], 2
    while data[i + 1] != 0xD9:
        seg = 2 + (data[i + 2] << 8 | data[i + 3])
        if data[i + 1] == 0xDA:
            found.append((i + seg, data[i + 5 + 2 * data[i + 4]], data[i + 5]))
            seg = (
                next(
                    j
                    for j in range(i + seg, len(data) - 1)
                    if data[j] == 0xFF and data[j + 1] not in (0, *range(0xD0, 0xD8))
                )
                - i
            )
        i += seg
    return found


@pytest.mark.parametrize("kind", ["420", "444", "grey"])
def test_progressive_file_at_one_eighth_from_its_dc_scans_is_the_whole_decode(progressive, kind):
    data, dec = progressive[kind], RoiDecoder()
    hd = dec.header(data)
    assert hd.progressive
    h, w = -(-hd.height // 8), -(-hd.width // 8)
    for rows, cols in [((0, h), (0, w)), ((5, h - 3), (7, w - 2)), ((h // 2, h // 2 + 1), (0, 1))]:
        dec.header(data)
        want = dec.decode(8, rows, cols, shortcuts=False).copy()
        dec.header(data)
        np.testing.assert_array_equal(dec.decode(8, rows, cols), want, err_msg=f"{kind}: rows {rows}, columns {cols}")
    # The luma's AC scans are not read at 1/8: a run of 1-bits (no Huffman code) in one of them does not
    # matter there, while a decode of every scan refuses the file.
    start, _, _ = [s for s in scans(data) if s[1] > 0 and s[2] == 1][0]
    broken = bytearray(data)
    broken[start + 4 : start + 44] = b"\xff\x00" * 20
    dec.header(bytes(broken))
    np.testing.assert_array_equal(dec.decode(8, (0, h), (0, w)), dec_whole(data, 8))
    dec.header(bytes(broken))
    with pytest.raises(RoiDecodeError):
        dec.decode(8, (0, h), (0, w), shortcuts=False)


def dec_whole(data: bytes, denom: int, **kw) -> np.ndarray:
    dec = RoiDecoder()
    hd = dec.header(data)
    return dec.decode(denom, (0, -(-hd.height // denom)), (0, -(-hd.width // denom)), **kw).copy()


@pytest.mark.parametrize("denom", [1, 8])
def test_truncated_progressive_file_is_refused_with_a_crop_at_its_top(progressive, denom):
    # The rows below the crop are not decoded, but a file that ends before its last scan does is refused.
    data, dec = progressive["420"], RoiDecoder()
    dec.header(data[: scans(data)[-1][0] + 100])
    with pytest.raises(RoiDecodeError, match="Premature end"):
        dec.decode(denom, (0, 4), (0, 10))


def shortcuts_match_whole_decodes(
    files: dict[str, bytes], rng: random.Random, crops: int, fast_share: float
) -> tuple[RoiDecoder, RoiDecoder]:
    """Random crops of the files at random scales: the decode with its shortcuts is the whole decode's
    pixels; the two decoders used (with the shortcuts, without)."""
    dec, whole = RoiDecoder(), RoiDecoder()
    for _ in range(crops):
        kind, denom, fast = rng.choice(sorted(files)), rng.choice([1, 2, 4, 8]), rng.random() < fast_share
        data = files[kind]
        hd = dec.header(data)
        h, w = -(-hd.height // denom), -(-hd.width // denom)
        y0, x0 = rng.randrange(h), rng.randrange(w)
        rows, cols = (y0, rng.randrange(y0 + 1, h + 1)), (x0, rng.randrange(x0 + 1, w + 1))
        got = dec.decode(denom, rows, cols, fast)
        whole.header(data)
        want = whole.decode(denom, rows, cols, fast, shortcuts=False)
        np.testing.assert_array_equal(
            got, want, err_msg=f"{kind} at 1/{denom} (fast={fast}), rows {rows}, columns {cols}"
        )
    return dec, whole


def test_progressive_rows_below_the_crop_are_not_decoded_yet_the_crop_is_exact(progressive):
    dec, whole = shortcuts_match_whole_decodes(progressive, random.Random(3), 60, fast_share=0.7)
    assert dec.skipped_rows > 0 and whole.skipped_rows == 0
    # A run of 1-bits (no Huffman code) near the end of every scan is never read for a crop at the top.
    data = progressive["444"]
    broken = bytearray(data)
    for start, _, _ in scans(data):
        end = start + next(i for i in range(len(data) - start) if data[start + i] == 0xFF and data[start + i + 1] != 0)
        if end - start > 64:  # (a scan of a flat band may be a few bytes)
            broken[end - 12 : end - 2] = b"\xff\x00" * 5
    dec.header(bytes(broken))
    np.testing.assert_array_equal(dec.decode(1, (0, 16), (0, 40)), dec_whole(data, 1)[:16, :40])
    dec.header(bytes(broken))
    with pytest.raises(RoiDecodeError):
        dec.decode(1, (0, 16), (0, 40), shortcuts=False)


def test_every_scan_skips_the_rows_below_the_crop_even_when_its_last_bytes_are_already_read():
    """At the crop's last row a scan's remaining bytes may all be in libjpeg's bit buffer, its next marker
    at the source's offset 0. That scan is skipped too: a crop ending two iMCU rows above the last one skips
    one row in every scan (taking offset 0 for 'no marker' left 3 of these 40 files with a scan decoded to
    its end)."""
    dec, short = RoiDecoder(), []
    for k in range(40):
        rng = np.random.default_rng(k)
        h, w = int(rng.integers(100, 600)), int(rng.integers(100, 600))
        img = Image.fromarray(rng.integers(0, 255, (h // 3, w // 3, 3), np.uint8)).resize((w, h), Image.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90, progressive=True, subsampling=k % 3)  # 4:4:4, 4:2:2, 4:2:0
        data, imcu = buf.getvalue(), 16 if k % 3 == 2 else 8
        y1 = (-(-h // imcu) - 3) * imcu + 1  # rows the crop needs end one iMCU row above the last
        dec.header(data)
        before = dec.skipped_rows
        got = dec.decode(1, (0, y1), (0, w))
        if dec.skipped_rows - before != len(scans(data)):
            short.append((k, dec.skipped_rows - before, len(scans(data))))
        np.testing.assert_array_equal(got, dec_whole(data, 1)[:y1])
    assert not short, f"(file, rows skipped, scans): {short}"


@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_roi_decode_has_simplejpegs_pixels(photos, progressive, denom):
    # simplejpeg's fastdct + fastupsample are the same libjpeg-turbo settings, decoded a whole image at once.
    for data in [*(f.read_bytes() for f in sorted(photos.rglob("*.JPEG"))[:3]), *progressive.values()]:
        whole = dec_whole(data, denom)
        want = simplejpeg.decode_jpeg(
            data, "RGB", fastdct=True, fastupsample=True, min_height=whole.shape[0], min_width=whole.shape[1],
            min_factor=min(denom, 2),
        )  # fmt: skip
        np.testing.assert_array_equal(whole, want)


@pytest.mark.parametrize(("fy", "fx"), [(1, 2), (2, 1), (2, 2)])
def test_halve_averages_pairs_and_keeps_an_odd_edge(fy, fx):
    img = np.random.default_rng(fy * 3 + fx).integers(0, 256, (37, 51 + 9, 3), np.uint8)[:, 4:55]  # strided rows
    got = halve(img, fy, fx)
    padded = np.pad(img.astype(int), ((0, 37 % fy), (0, 51 % fx), (0, 0)), mode="edge")  # odd edge: itself
    want = padded.reshape(-(-37 // fy), fy, -(-51 // fx), fx, 3).sum((1, 3))
    np.testing.assert_array_equal(got, (want + fy * fx // 2) // (fy * fx))
    with pytest.raises(ValueError, match="RGB uint8"):
        halve(img[..., :2], fy, fx)


def test_crop_shrunk_two_to_four_times_along_one_axis_is_antialiased(photos):
    out, area = np.empty((224, 224, 3), np.uint8), np.empty((224, 224, 3), np.uint8)
    # One-pixel stripes: bilinear taps alone would alias them into bands; averaged, they are flat grey.
    stripes = np.zeros((300, 520, 3), np.uint8)
    stripes[:, ::2] = 255
    decoders._shrink_into(stripes, out)
    assert abs(out.astype(int).mean() - 127.5) < 1 and out.std() < 2
    # On a photograph it stays within rounding of OpenCV's area average.
    photo = dec_whole(sorted(photos.rglob("*.JPEG"))[0].read_bytes(), 1)[:300, :470]
    decoders._shrink_into(photo, out)
    cv2.resize(photo, (224, 224), dst=area, interpolation=cv2.INTER_AREA)
    assert np.abs(out.astype(int) - area).mean() < 2


def segments(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each marker segment of a JPEG after its start-of-image marker, a scan's with its
    entropy-coded data, up to its end-of-image marker."""
    found, i = [], 2
    while data[i + 1] != 0xD9:
        end = i + 2 + (data[i + 2] << 8 | data[i + 3])
        if data[i + 1] == 0xDA:
            end = next(
                j for j in range(end, len(data) - 1) if data[j] == 0xFF and data[j + 1] not in (0, *range(0xD0, 0xD8))
            )
        found.append((i, end))
        i = end
    return found


def without_ac_scans(data: bytes) -> bytes:
    """`data` as if its AC scans had never been sent: its DC scans alone."""
    keep = [data[a:b] for a, b in segments(data) if data[a + 1] != 0xDA or data[a + 5 + 2 * data[a + 4]] == 0]
    return data[:2] + b"".join(keep) + b"\xff\xd9"


def test_progressive_file_without_its_ac_scans_decodes_the_same_with_the_shortcuts(progressive):
    # libjpeg estimates the AC coefficients that were never sent from the neighbouring blocks (block
    # smoothing): a crop that reads DC scans alone or leaves rows below out would differ, so the shortcuts
    # are not taken for such a file.
    files = {kind: without_ac_scans(data) for kind, data in progressive.items()}
    for kind, data in files.items():
        assert [s[1] for s in scans(data)] == [0] * len(scans(data)), kind
    shortcuts_match_whole_decodes(files, random.Random(5), 40, fast_share=0.5)


def scan_bomb(data: bytes, repeats: int) -> bytes:
    """A progressive file of `repeats` identical AC scans, which libjpeg accepts: a grey file's DC scan and
    first AC scan (coefficients 1..5), then its scan of coefficients 6..63 made final (Al = 0) again and again."""
    segs = segments(data)
    sos = [(a, b) for a, b in segs if data[a + 1] == 0xDA]
    a, b = sos[2]
    scan = bytearray(data[a:b])
    scan[7 + 2 * scan[4]] = 0x00  # Ah/Al
    return data[:a] + bytes(scan) * repeats + b"\xff\xd9"


def test_scan_bomb_is_refused_before_it_is_decoded(progressive):
    data = progressive["grey"]
    assert [s[1] for s in scans(data)][:3] == [0, 1, 6]  # libjpeg's grey script: DC, AC 1-5, AC 6-63
    dec = RoiDecoder()
    ok = scan_bomb(data, 20)
    assert len([1 for a, _ in segments(ok) if ok[a + 1] == 0xDA]) == 22
    hd = dec.header(ok)
    assert dec.decode(1, (0, hd.height), (0, hd.width)).shape == (hd.height, hd.width, 3)
    bomb = scan_bomb(data, 2000)
    dec.header(bomb)
    with pytest.raises(RoiDecodeError, match=r"JPEG has 2002 scans, more than 100 \(a scan bomb\?\): refused"):
        dec.decode(1, (0, 8), (0, 8))
    # where the scans cannot be counted up front (a stream that does not parse to its end), the 101st stops it
    dec.header(bomb[:-2] + b"\x00\x00")
    with pytest.raises(RoiDecodeError, match="more than 100 scans"):
        dec.decode(1, (0, 8), (0, 8))


def test_producer_counts_the_scan_bomb_as_bad_with_its_name(procs, ipc_dir, tmp_path, photos, progressive):
    data = tmp_path / "ds"
    shutil.copytree(photos / "n00000000", data / "a")
    (data / "a" / "bomb.jpg").write_bytes(scan_bomb(progressive["grey"], 2000))
    err = one_bad_file_run(procs, ipc_dir, data)
    assert "bomb.jpg: JPEG has 2002 scans, more than 100 (a scan bomb?): refused" in err
