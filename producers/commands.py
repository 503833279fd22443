"""Command lines that start a producer process, for whoever launches producers (the trainer, scripts).

Keeping them here means the flags are spelled in one place, next to the
subcommands that parse them: `producer_command` for any producer,
`producer_argv` for one of a run's producers (its id, HWM, stats file, rate,
keys), which runner/producer_group.py builds from the run's flags.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

KINDS = ("synthetic", "decode", "dali", "loader", "read")  # loader: the user's own (--loader MODULE:CALLABLE)


def producer_command(
    kind: str,
    endpoint: str,
    batch: int,
    image_size: int,
    data: str | None = None,
    workers: int = 1,
    fmt: str = "native",
    count: int | None = None,
    dali_device: str = "cpu",
    quiet: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """argv for `python -m producers KIND` pushing batch x image_size² x 3 uint8 batches to `endpoint`.

    `data` (an ImageNet-layout folder) is required by the decode and dali
    kinds and ignored by synthetic; `extra` is appended as is (e.g.
    ["--on-bad-file", "fail"]). The producer connects; the consumer binds.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown producer kind {kind!r} (choose from {', '.join(KINDS)})")
    cmd = [sys.executable, "-m", "producers", kind, "--endpoint", endpoint, "--wire-format", fmt]
    cmd += ["--batch", str(batch), "--image-size", str(image_size), "--workers", str(workers)]
    if kind in ("decode", "dali", "read"):
        if not data:
            raise ValueError(f"the {kind} producer needs a data folder (ImageNet layout: DIR/<class>/<image>.JPEG)")
        cmd += ["--data", data]
    if kind == "dali":
        cmd += ["--dali-device", dali_device]
    if count is not None:
        cmd += ["--count", str(count)]
    if quiet:
        cmd.append("--quiet")
    return [*cmd, *extra]


def producer_argv(
    kind: str,
    endpoint: str,
    producer_id: int,
    batch: int,
    image_size: int,
    fmt: str,
    workers: int,
    hwm: int,
    data: str | None = None,
    curve_keys: str | None = None,
    rate: float | None = None,
    stats_file: str | None = None,
    dali_threads: int = 1,
    dali_device: str | None = None,
    cpu_ms_per_batch: float | None = None,
    busy_wait: bool = False,
    device_id: int | None = None,
    loader: str | None = None,
    loader_args: list[str] | tuple[str, ...] = (),
    loader_timeout: float | None = None,
) -> list[str]:
    """The command line of one of a run's producers (any kind) that connects to the run's endpoint.

    `rate` caps each worker's images/s; `stats_file` is where the producer writes
    its own figures once a second (read where the consumer sees no native headers).
    """
    extra = ["--hwm", str(hwm), "--producer-id", str(producer_id)]
    if rate:
        extra += ["--rate", f"{rate:g}"]
    if curve_keys:
        extra += ["--curve-keys", curve_keys]
    if stats_file:
        extra += ["--stats-file", stats_file]
    if kind == "dali":
        extra += ["--dali-threads", str(dali_threads or 1)]
        if device_id is not None and dali_device == "gpu":  # decode on the GPU this producer feeds
            extra += ["--device-id", str(device_id)]
    if busy_wait:
        extra += ["--busy-wait"]
    if cpu_ms_per_batch and kind == "synthetic":
        extra += ["--cpu-ms-per-batch", f"{cpu_ms_per_batch:g}"]
    if kind == "loader":
        extra += _loader_flags(loader, loader_args, loader_timeout)
    return producer_command(
        kind,
        endpoint,
        batch,
        image_size,
        data=data,
        workers=workers,
        fmt=fmt,
        quiet=True,
        extra=extra,
        dali_device=dali_device or "cpu",
    )


def _loader_flags(loader: str | None, loader_args: Sequence[str], timeout: float | None) -> list[str]:
    """The user's loader, checked by the producer against the run's batch and image size."""
    flags = ["--loader", loader or "", *[a for text in loader_args for a in ("--loader-arg", text)]]
    return flags + (["--loader-timeout", f"{timeout:g}"] if timeout else [])
