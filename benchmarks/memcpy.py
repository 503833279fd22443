"""Same-run reference figures that input-path throughput is compared against.

A GB/s figure means little on its own: the machine's single-core memcpy
bandwidth, measured in the same run, says how close to the hardware a path gets.
"""

from __future__ import annotations

import time

import numpy as np

from profiler.summary import Summary


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> Summary:
    """Single-core memcpy bandwidth in bytes/s (one np.copyto of a buffer bigger than the caches)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append(nbytes / (time.perf_counter() - t0))
    return Summary.of(rates)
