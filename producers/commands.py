"""Command lines that start a producer process, for whoever launches producers (the trainer, scripts).

Keeping them here means the flags are spelled in one place, next to the
subcommands that parse them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

KINDS = ("synthetic", "decode", "dali", "loader")  # loader: the user's own (--loader MODULE:CALLABLE)


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
    if kind in ("decode", "dali"):
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
