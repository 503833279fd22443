"""gpu-decode's decoder on a real GPU: a batch holding a file nvJPEG refuses is still whole (that file decoded on
the host and named), and a file neither decoder reads stops the batch naming it. Skipped without a CUDA GPU."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: nvJPEG is the device's decoder"),
    pytest.mark.timeout(300),
]


def _jpeg(mode: str, size=(96, 64), seed: int = 0) -> bytes:
    from PIL import Image

    # Smooth colour ramps: decoders may differ by a level or two there, while on random pixels their chroma
    # upsampling alone differed by 13 levels on average (nvJPEG against libjpeg-turbo, H200, 2026-11-28).
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0 : size[1], 0 : size[0]]
    phase = rng.uniform(0, 6.28, 3)
    pixels = np.stack([127 + 100 * np.sin(xs / 17 + ys / 23 + p) for p in phase], axis=-1).astype(np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def _items(files: list[bytes]) -> np.ndarray:
    items = np.empty(len(files), dtype=object)
    items[:] = [np.frombuffer(f, dtype=np.uint8) for f in files]
    return items


def test_a_batch_with_cmyk_and_grayscale_files_decodes_whole_on_the_gpu_and_names_what_the_host_took():
    from torchvision.io import ImageReadMode, decode_jpeg

    from consumers.gpu_decode.torch import decode_batch

    files = [_jpeg("RGB", seed=1), _jpeg("CMYK", seed=2), _jpeg("L", seed=3), _jpeg("RGB", seed=4)]
    names = ["a.JPEG", "cmyk.JPEG", "gray.JPEG", "b.JPEG"]
    on_host: list[str] = []
    got = decode_batch(_items(files), torch.device("cuda", 0), names, on_host.append)
    assert len(got) == 4
    for image, data, name in zip(got, files, names):
        assert image.device.type == "cuda" and image.dtype == torch.uint8 and image.shape == (3, 64, 96), name
        host = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        diff = (image.cpu().int() - host.int()).abs().float().mean().item()
        assert diff < 4, f"{name}: the device's pixels differ from the host decoder's by {diff:.1f} on average"
    assert set(on_host) <= {"cmyk.JPEG"}, on_host  # only a file nvJPEG refuses goes to the host


def test_a_truncated_file_stops_the_batch_naming_it():
    from consumers.gpu_decode.torch import UndecodableFile, decode_batch

    good = _jpeg("RGB", seed=5)
    with pytest.raises(UndecodableFile, match="cut.JPEG"):
        decode_batch(_items([good, good[:200]]), torch.device("cuda", 0), ["ok.JPEG", "cut.JPEG"])
