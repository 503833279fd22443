"""torchvision's ResNet-50 as the PyTorch trainer builds it: v1.5 and v1 differ only in where they stride.

Run by tests/test_torch_models.py in a pytest of its own: torchvision aborts
when it is imported into a process that loaded TensorFlow first, as the rest
of the suite does (the two trainers never share a process).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchvision.models.resnet import Bottleneck  # noqa: E402

from models.torch import normalize, resnet50  # noqa: E402


def strides(model) -> list[tuple]:
    return [(b.conv1.stride, b.conv2.stride) for b in model.modules() if isinstance(b, Bottleneck)]


def test_v15_strides_on_the_3x3_and_v1_on_the_first_1x1():
    v15, v1 = strides(resnet50("1.5")), strides(resnet50("1"))
    down = [i for i, (a, b) in enumerate(v15) if b != (1, 1)]
    assert len(down) == 3  # the first block of stages 2, 3 and 4
    assert all(v15[i] == ((1, 1), (2, 2)) and v1[i] == ((2, 2), (1, 1)) for i in down)
    assert [s for i, s in enumerate(v1) if i not in down] == [s for i, s in enumerate(v15) if i not in down]


def test_both_versions_have_resnet50s_parameter_count_and_output():
    for version in ("1", "1.5"):
        m = resnet50(version)
        assert sum(p.numel() for p in m.parameters()) == 25_557_032
        assert m(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)


def test_nhwc_batches_become_channels_last_nchw():
    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    x = normalize(images, channels_last=True)
    assert x.shape == (2, 3, 8, 8) and x.is_contiguous(memory_format=torch.channels_last)
    assert normalize(images, channels_last=False).is_contiguous()
    assert torch.allclose(x, normalize(images, channels_last=False))


def test_unknown_version_is_one_clear_error():
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="--resnet-version '2'"):
        resnet50("2")


def test_copy_bandwidth_is_measured():
    from harness.torch.bandwidth import copy_gbps

    assert copy_gbps(1_000_000, pinned=False, repeats=2) > 0
