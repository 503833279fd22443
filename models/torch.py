"""The model each rank trains: torchvision's ResNet-50 (v1.5 or v1), an input-only stand-in, or an emulated device.

torchvision's ResNet-50 is v1.5: a downsampling bottleneck strides on its 3x3
conv. v1 (the original paper, tensorpack's benchmark) strides on the first
1x1 conv instead; `resnet50(version="1")` moves the stride there, nothing
else changes (25,557,032 parameters either way).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from core.errors import ConfigError

NUM_CLASSES = 1000
# ImageNet channel statistics in the 0-255 pixel scale (RGB), as the TensorFlow model uses them.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def resnet50(version: str = "1.5", num_classes: int = NUM_CLASSES) -> nn.Module:
    """torchvision's ResNet-50, randomly initialised; version "1" strides on the first 1x1 conv.

    torchvision is imported here, not with the module: it costs a rank about 1.5 s of CPU to import, and a
    rank that trains the input-only stand-in or an emulated device never needs it.
    """
    if version not in ("1", "1.5"):
        raise ConfigError(f"--resnet-version {version!r}: choose 1 or 1.5")
    from torchvision.models import resnet50 as tv_resnet50
    from torchvision.models.resnet import Bottleneck

    model = tv_resnet50(weights=None, num_classes=num_classes)
    if version == "1":
        for block in model.modules():
            if isinstance(block, Bottleneck) and block.conv2.stride != (1, 1):
                block.conv1.stride, block.conv2.stride = block.conv2.stride, (1, 1)
    return model


class InputOnly(nn.Module):
    """No model (--input-only): one trainable scalar touched by the batch, so every input byte is read."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float().mean(dim=(1, 2, 3)) * self.scale).unsqueeze(1).expand(-1, 2)


class EmulatedDevice(nn.Module):
    """A device that takes `batch / rate` seconds per step without using host CPU, from the moment its batch
    is on the device (on a GPU: once the batch's host-to-device copy is done).

    Like a GPU, it runs a step while the host goes on: `forward` waits only until the device has finished
    the previous step, then hands the batch over and returns, so the host prepares the next batch while
    this one is consumed (a path that makes its batches on the step's own thread, like `cpu`, overlaps
    them with the device as it does on a real GPU). `finish` waits for the step under way: a timed window
    ends there. `idle` is how long the device waited for this step's batch: its input wait.

    The hook for `--model emulated`: the rate and where it comes from are
    given by whoever selects it, and every report labels the run as emulated.
    """

    def __init__(self, images_per_sec: float) -> None:
        super().__init__()
        if images_per_sec <= 0:
            raise ConfigError(f"emulated device rate {images_per_sec:g} must be above 0 images/s")
        self.images_per_sec = images_per_sec
        self.scale = nn.Parameter(torch.ones(()))
        self._due = 0.0  # when the step under way ends, on an absolute schedule (0: no step yet)
        self.idle = 0.0  # seconds the device waited for the last batch it was handed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # The device's time starts when the batch is there, as TensorFlow's kernel starts it from a
            # stream callback: this stream waits for the batch's copy (the path's event), so once the
            # event recorded here has passed, the copy is done. Without it a copy-bound path looks fed.
            arrived = torch.cuda.Event()
            arrived.record()
            arrived.synchronize()
        # When the batch was there: before the wait below, so a host that wakes late from it (a busy
        # machine) is not read as the device waiting for input.
        ready, step = time.perf_counter(), x.shape[0] / self.images_per_sec
        self.finish()  # the previous step occupies the device until its end
        # Absolute deadlines, so the host's own time between steps does not add up: a batch that comes late
        # (input wait) starts a new schedule. Up to a tenth of a step of lateness is taken from the slack.
        start = self._due if self._due and ready - self._due < 0.1 * step else ready
        self.idle = start - self._due if self._due else 0.0
        self._due = start + step
        return (x[:, :1, :1, :1].float().flatten(1) * self.scale).expand(-1, 2)

    def finish(self) -> None:
        """Wait until the step under way has ended (the device's synchronize)."""
        time.sleep(max(0.0, self._due - time.perf_counter()))


class StandInSGD:
    """Plain SGD for a stand-in's one scalar (InputOnly, EmulatedDevice), with torch.optim's calls.

    torch.optim's first call imports TorchDynamo, about a second of CPU per rank; a stand-in trains nothing
    worth it, and a capacity search starts its ranks again for every probe.
    """

    def __init__(self, params, lr: float) -> None:
        self.params = list(params)
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std tensors, made once per device: building them per step copies (and syncs) every step."""
    if device not in _STATS:
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).to(device)
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1).to(device)
        _STATS[device] = (mean, std)
    return _STATS[device]


def normalize(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """uint8 NHWC images on the device -> float32 NCHW (channels-last in memory for NHWC), ImageNet-normalised."""
    x = images.permute(0, 3, 1, 2).float()  # an NHWC tensor viewed as NCHW is channels-last already
    mean, std = _stats(x.device)
    x = (x - mean) / std
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
