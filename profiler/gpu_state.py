"""The GPUs' own state beside each timed window: clocks, power, temperature, utilisation, throttle reasons (NVML).

A GPU that slows down (power cap, heat) moves a figure without any input
path being at fault; a ratio whose two sides ran at different clocks says
more about the GPU than about the input. So on a machine with NVIDIA GPUs a
thread of the run's own process reads every GPU the run uses through NVML
(NVIDIA's binding, `nvidia-ml-py`: the driver's own library, not a parser
of `nvidia-smi` text) SAMPLE_S apart, and each path's result gets, per
timed window, the medians of what its GPUs reported in it (`gpu_state`)
and every throttle reason seen active. Windows are in time.perf_counter
seconds, the clock both trainers time steps with (CLOCK_MONOTONIC: the same
in every process of this host).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence

SAMPLE_S = 0.25  # four samples a second: at least two in any window longer than half a second
FIGURES = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct")
# NVML's clock event (throttle) reasons, by bit; idle, an application clock setting and sync boost are not a
# slowdown of a working GPU.
REASONS = {
    0x4: "power cap (software)",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake (hardware)",
}
CLOCK_TOLERANCE = 0.02  # SM clock medians further apart than this differ
POWER_TOLERANCE = 0.10  # and power medians


class GpuState:
    """Samples GPUs `indices` (NVML's numbering) on a thread; `windows(spans)` gives each span's medians."""

    def __init__(self, indices: Sequence[int], interval: float = SAMPLE_S) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self.indices = list(indices)
        self.interval = interval
        self.samples: list[tuple[float, dict]] = []  # (perf_counter, {figure: value, "reasons": bits}) per GPU
        self._taken = 0  # samples handed to the timeline so far
        self.failed_reads = 0  # reads NVML refused, skipped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedbench-nvml", daemon=True)

    @classmethod
    def open(cls, count: int) -> GpuState | None:
        """A sampler of the first `count` GPUs, or None where NVML cannot be read (no driver library)."""
        try:
            import pynvml
        except ImportError as e:  # nvidia-ml-py not installed
            print(f"note: GPU clocks and power not sampled: {e}", flush=True)
            return None
        try:
            return cls(range(count))
        except pynvml.NVMLError as e:  # no driver library, no such GPU
            print(f"note: GPU clocks and power not sampled (NVML: {e})", flush=True)
            return None

    def __enter__(self) -> GpuState:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.nvml.nvmlShutdown()

    def _run(self) -> None:
        """Sample until stopped; a read NVML refuses (a GPU busy resetting, a driver timeout) is skipped and
        counted, so one failed read does not end the sampling for the rest of the run."""
        while not self._stop.is_set():
            t = time.perf_counter()
            for i, h in zip(self.indices, self.handles):
                try:
                    self.samples.append((t, {"gpu": i, **self.read(h)}))
                except self.nvml.NVMLError:
                    self.failed_reads += 1
            self._stop.wait(self.interval)

    def read(self, handle) -> dict:
        """One GPU's figures now: SM and memory clocks (MHz), power (W), temperature (C), utilisation (%)."""
        n = self.nvml
        try:
            reasons = n.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except n.NVMLError_FunctionNotFound:  # a driver older than the name
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        return {
            "sm_mhz": n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
            "mem_mhz": n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM),
            "power_w": n.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "temp_c": n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU),
            "util_pct": n.nvmlDeviceGetUtilizationRates(handle).gpu,
            "reasons": reasons,
        }

    def windows(self, spans: Sequence[Sequence[float]]) -> list[dict]:
        """Per (start, end) span: the medians of its samples, over every GPU, and the throttle reasons seen."""
        return [summary([s for t, s in list(self.samples) if a <= t <= b]) for a, b in spans]

    def since_last(self) -> dict:
        """The medians of the samples since the last call: one row of the run's timeline."""
        new = list(self.samples[self._taken :])
        self._taken += len(new)
        got = summary([s for _, s in new])
        return {k: got[k] for k in FIGURES if got.get(k) is not None}


def summary(samples: list[dict]) -> dict:
    """Medians of `samples`' figures, the number of samples, and every throttle reason active in one of them."""
    out: dict = {"samples": len(samples)}
    for k in FIGURES:
        out[k] = statistics.median(s[k] for s in samples) if samples else None
    bits = 0
    for s in samples:
        bits |= int(s["reasons"])
    out["throttle_reasons"] = [words for bit, words in REASONS.items() if bits & bit]
    return out


def differs(path_windows: list[dict], base_windows: list[dict]) -> str | None:
    """Words for a path whose windows ran at other clocks, power or throttling than the baseline's, or None."""
    mine, base = _medians(path_windows), _medians(base_windows)
    words = []
    if mine["sm_mhz"] and base["sm_mhz"] and abs(mine["sm_mhz"] / base["sm_mhz"] - 1) > CLOCK_TOLERANCE:
        words.append(f"SM clock {mine['sm_mhz']:.0f} MHz vs the baseline's {base['sm_mhz']:.0f}")
    if mine["power_w"] and base["power_w"] and abs(mine["power_w"] / base["power_w"] - 1) > POWER_TOLERANCE:
        words.append(f"power {mine['power_w']:.0f} W vs {base['power_w']:.0f}")
    if throttled := throttled_words(path_windows):
        words.append(throttled)
    return "GPU " + "; ".join(words) if words else None


def throttled_words(windows: list[dict]) -> str | None:
    """`throttled in window 2: thermal (hardware)`: each window whose GPU slowed itself, or None."""
    named = [f"window {i + 1}: {', '.join(w['throttle_reasons'])}" for i, w in enumerate(windows)
             if w.get("throttle_reasons")]  # fmt: skip
    return "throttled in " + "; ".join(named) if named else None


def _medians(windows: list[dict]) -> dict:
    got = {k: [w[k] for w in windows if w.get(k) is not None] for k in ("sm_mhz", "power_w")}
    return {k: statistics.median(v) if v else None for k, v in got.items()}
