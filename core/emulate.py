"""Emulated accelerators: published ResNet-50 training rates per device, and how runs are labelled.

Framework-neutral (both trainers use it). Every rate here is images/s for one
device training ResNet-50 v1.5 in mixed precision, derived from a published
figure; docs/emulated.md cites each source and shows the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """One device's published ResNet-50 training rate."""

    name: str
    images_per_sec: float  # per device
    source: str  # short citation; the full one is in docs/emulated.md

    def to_dict(self) -> dict:
        return {"name": self.name, "images_per_sec": self.images_per_sec, "source": self.source}


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "A100",
            2470.0,
            "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, 1x A100 80GB, mixed precision (pytorch-21.03)",
        ),
        Preset(
            "H100",
            7000.0,
            "MLPerf Training v3.0, ResNet-50 v1.5 on 8x H100 (MXNet, 3.0-2053): ~56,000 img/s over 8 GPUs",
        ),
        Preset(
            "H200",
            7940.0,
            "MLPerf Training v4.0, NVIDIA 8x H200-SXM-141GB (ngc24.04_mxnet): ~63,550 img/s steady state over 8 GPUs",
        ),
    )
}
# B200: no public ResNet-50 training figure (MLPerf Training dropped ResNet-50 after v4.0); see docs/emulated.md.
DEFAULT_PRESET = "H100"


def rate_text(rate: float) -> str:
    """A rate as people read it: `97,361,705,223`, `7,000`, `12.5`, `0.25`, `1.00e-09` (never `0` for a small one)."""
    if rate >= 1000:
        return f"{rate:,.0f}"
    if rate >= 0.01:
        return f"{rate:.4g}"
    return f"{rate:.2e}"


def duration_text(seconds: float) -> str:
    """`8.0 s`, `5.3 min`, `2.2 h`, `3.1 days`, `253.7 years`."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.3g} s"


def check_step(rate: float, batch: int, limit_s: float) -> None:
    """EmulateError when one emulated step of `batch` images at `rate` per device would outlast `limit_s`.

    Such a run would sit in its first step for longer than it waits for
    anything else (--recv-timeout), and look hung.
    """
    step = batch / rate
    if step > limit_s:
        raise EmulateError(
            f"--emulate-rate {rate:g}: one step of {batch} images at {rate_text(rate)} img/s per device would take "
            f"{duration_text(step)}, longer than the run waits for anything (--recv-timeout {limit_s:g} s); "
            f"give at least {rate_text(batch / limit_s)} img/s"
        )


class EmulateError(ValueError):
    """A bad --emulate / --emulate-rate value; the message names it."""


def preset(name: str) -> Preset:
    """The preset called `name` (case-insensitive), or EmulateError listing the known ones."""
    for key, p in PRESETS.items():
        if key.lower() == name.strip().lower():
            return p
    raise EmulateError(f"--emulate {name}: unknown device; known: {', '.join(PRESETS)} (or give --emulate-rate N)")


@dataclass(frozen=True)
class Emulation:
    """What an emulated run stands for: a rate per device and where it comes from."""

    images_per_sec: float  # per device
    device: str  # preset name, or "custom"
    source: str

    @classmethod
    def of(cls, name: str | None, rate: float | None) -> Emulation:
        """From --emulate NAME and/or --emulate-rate N (an explicit rate wins, labelled as such)."""
        if rate is not None:
            if not rate > 0:
                raise EmulateError(f"--emulate-rate {rate:g} must be more than 0 images/s")
            if name:
                p = preset(name)
                return cls(
                    float(rate), p.name, f"--emulate-rate {rate:g} (in place of {p.name}'s {p.images_per_sec:g})"
                )
            return cls(float(rate), "custom", f"--emulate-rate {rate:g}")
        p = preset(name or DEFAULT_PRESET)
        return cls(p.images_per_sec, p.name, p.source)

    def label(self) -> str:
        """How every table says it: `emulated H100 (7,000 img/s per device)`."""
        return f"emulated {self.device} ({rate_text(self.images_per_sec)} img/s per device)"

    def to_dict(self) -> dict:
        return {"emulated": True, "device": self.device, "images_per_sec": self.images_per_sec, "source": self.source}

    def devices(self, images_per_sec: float) -> float:
        """How many of these devices a total rate keeps busy."""
        return images_per_sec / self.images_per_sec
