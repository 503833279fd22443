"""How sure each figure is: an interval for a path's median images/s and for its ratio to the baseline.

Framework-neutral; it reads only what every result holds: `images_per_sec`
(profiler/summary.py), whose `repeats` are the per-window images/s in the
order the windows ran, and, when present, `schedule.timed_steps_per_window`.

Method: a distribution-free order-statistics interval for the median. For n
windows drawn from any continuous distribution, the median lies between the
k-th smallest and the k-th largest window with probability
1 - 2·P(Binomial(n, 1/2) < k), exactly. We take the narrowest such interval
whose confidence is at least 95%; below 6 windows none reaches 95%, and the
interval is the windows' min–max, with its own confidence reported
(75% with 3 windows, 94% with 5). Why not a bootstrap: with the 3 to 7
windows a run has, a bootstrap of the median can only return window values
anyway, its confidence is unknown and it depends on a seed; the order
statistics give the same kind of interval with a confidence that is exact.
The caveat both share: windows are treated as independent draws, which a
machine whose load drifts during the run does not give.

The ratio path/baseline: with --interleave N (harness/interleave.py) the
path and the baseline ran in N pairs of back-to-back runs (the result's
`interleaved` block); the N paired ratios get the median's interval
(`alternating runs`): a disturbance that hits both runs of a pair cancels. Paths measured one after another have no such pairing (which
window is "i" is arbitrary, and the interval would depend on it); their
interval is the distribution-free one for a shift between two samples
(Moses' interval from the Mann–Whitney statistic, the one that goes with the
Hodges–Lehmann estimate), on the logs of the windows: the k-th smallest to
the k-th largest of every ratio path window / baseline window, with k from
the exact distribution of U, again the narrowest with 95% or, with few
windows, the min–max (3 windows each: 90%) (`pairwise ratios`). It assumes
the noise has the same shape in both runs, the path's only scaled.

A ratio whose interval holds 1.0 is "same as baseline (within noise)": the
run cannot tell the path from the baseline, and nothing else in the report
may read a limit or advice into it. `windows_needed` says roughly how many
windows would separate the observed difference from the noise (normal
approximation on the log of the windows).
"""

from __future__ import annotations

import functools
import math
import statistics
import struct
from collections.abc import Sequence

from core.registry import BASELINE

CONFIDENCE = 0.95
# The order-statistics interval of the median reaches 95% from this many windows on.
MIN_WINDOWS_95 = 6
WITHIN_NOISE = "same as baseline (within noise)"
ONE_WINDOW = "one window: noise unknown"
# Differences smaller than this share are not worth the windows it would take to resolve them.
NEGLIGIBLE = 0.01
# Above this relative spread of a path's windows ((max - min) / median) the machine is noisy.
NOISY_SPREAD = 0.10


# A window measured between two batch boundaries (it opens when a batch arrives) needs this many batches after
# the one that opened it: prefetched batches arrive in bursts, and a window of one burst has a time near zero.
BOUNDARY_BATCHES = 3
# A window that opens at a step's or a pass's start holds whole batches' time from its first batch on: one does.
STEP_BATCHES = 1


def window_rate(images: float, seconds: float, batches: int, need: int = BOUNDARY_BATCHES) -> float | None:
    """Images/s of one timed window, or None ("not measured") where it timed fewer than `need` batches or no
    time: the one place a rate is divided out of a window's time (loader-only and its slices, --tune, --epochs
    and their 1-second bins, the trainers' windows and so the capacity probes, each producer's count over a
    trainer's window, the timeline's rows), so that a denominator near zero never becomes a figure.
    """
    if batches < need or not math.isfinite(seconds) or seconds <= 0 or not math.isfinite(images):
        return None
    return images / seconds


def not_measured(batches: int) -> str:
    """What a table and the JSON say in place of a rate from too few batches."""
    return f"not measured ({batches:g} batches in the window)"


def _binom_tail(n: int) -> list[float]:
    """P(Binomial(n, 1/2) < k) for k = 0 .. n // 2 + 1, in one pass (n up to thousands: exact integers)."""
    out, below, c = [0.0], 0, 1
    for i in range(n // 2 + 1):
        below += c  # c = C(n, i)
        out.append(below / 2**n)
        c = c * (n - i) // (i + 1)
    return out


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, its confidence) for the median of `values` by order statistics; see the module's docstring.

    One value gives (v, v, 0.0): no spread to judge by. The interval always holds the values' median.
    """
    if not values:
        raise ValueError("no windows to take an interval of")
    xs = sorted(values)
    n = len(xs)
    if n == 1:
        return xs[0], xs[0], 0.0
    tail = _binom_tail(n)
    # The largest k (narrowest interval) whose coverage still reaches `confidence`; k = 1 (min–max) otherwise.
    best = 1
    for k in range(1, n // 2 + 1):
        if 1 - 2 * tail[k] >= confidence:
            best = k
        else:
            break
    return xs[best - 1], xs[n - best], 1 - 2 * tail[best]


def method_words(n: int) -> str:
    """How the interval of n windows was taken, for the JSON and the table's footnote."""
    if n <= 1:
        return "one window: no interval"
    lo, hi, conf = median_interval(list(range(n)))
    if lo == 0:
        return f"order statistics of {n} windows: min–max, {100 * conf:.0f}% confidence for the median"
    return f"order statistics of {n} windows: {lo + 1}th smallest to {lo + 1}th largest, {100 * conf:.0f}% confidence"


def windows_needed(path_windows: Sequence[float], base_windows: Sequence[float], ratio: float) -> int | None:
    """Roughly how many windows per path would tell `ratio` from 1.0, from the windows' spread.

    Normal approximation: the log-ratio of two medians of n windows has a standard error of about
    1.2533 · sqrt(s_path² + s_base²) / sqrt(n) (s: the standard deviation of the log of the windows);
    n is the smallest count that puts 1.96 of them inside |log ratio|, and never below the 6 windows the
    order-statistics interval needs for 95%. None when the difference is under 1% (not worth resolving)
    or there is no spread to estimate from.
    """
    if ratio <= 0 or abs(ratio - 1) < NEGLIGIBLE:
        return None
    spread = [statistics.stdev([math.log(v) for v in w]) for w in (path_windows, base_windows) if len(w) >= 2]
    if not spread or min(min(path_windows, default=1), min(base_windows, default=1)) <= 0:
        return None
    s = math.sqrt(sum(x * x for x in spread) * (2 / len(spread)))  # one side unknown: assume alike
    need = (1.96 * 1.2533 * s / abs(math.log(ratio))) ** 2
    return max(MIN_WINDOWS_95, math.ceil(need))


# Up to this many pairs (n·m) the Mann–Whitney distribution is counted exactly; above, its normal approximation
# (with continuity correction) picks k: the exact count grows as (n·m)², the approximation costs nothing.
EXACT_PAIRS = 400


@functools.lru_cache(maxsize=64)
def _mann_whitney_counts(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orderings give each value of the Mann–Whitney U (0..n·m), exactly."""
    # f[i][j][u]: orderings of i and j values with statistic u; f(i, j) = f(i-1, j) shifted by j + f(i, j-1).
    prev = [[1] for _ in range(m + 1)]  # i = 0: one ordering, U = 0
    for i in range(1, n + 1):
        cur = [[1]]  # j = 0
        for j in range(1, m + 1):
            a, b = prev[j], cur[j - 1]
            size = i * j + 1
            row = [0] * size
            for u, c in enumerate(a):
                row[u + j] += c
            for u, c in enumerate(b):
                row[u] += c
            cur.append(row)
        prev = cur
    return prev[m]


def _moses_k(n: int, m: int, confidence: float) -> tuple[int, float]:
    """(k, its confidence): the narrowest Moses interval, the k-th smallest to k-th largest of the n·m shifts."""
    if n * m <= EXACT_PAIRS:
        counts, total = _mann_whitney_counts(n, m), math.comb(n + m, n)
        best, below = 1, 0
        for k in range(1, n * m // 2 + 1):
            below += counts[k - 1]  # orderings with U <= k - 1 (the list is cached: never changed here)
            if 1 - 2 * below / total >= confidence:
                best = k
            else:
                break
        return best, 1 - 2 * sum(counts[:best]) / total
    mean, sd = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    best = max(1, math.floor(mean + 0.5 - z * sd))
    return best, 1 - 2 * statistics.NormalDist().cdf((best - 0.5 - mean) / sd)


def _order_key(d: float) -> int:
    """An integer that orders finite doubles as their values do (adjacent doubles: adjacent integers)."""
    b = struct.unpack("<q", struct.pack("<d", d))[0]
    return b if b >= 0 else -(b & 0x7FFFFFFFFFFFFFFF)


def _from_key(k: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", k if k >= 0 else (-k) | (1 << 63)))[0]


def _pairs_at_most(xs: list[float], ys: list[float], d: float) -> int:
    """How many x - y (x of sorted xs, y of sorted ys) are <= d: a walk of both lists, O(n + m)."""
    count, j = 0, 0
    for x in xs:  # x grows: the first y with x - y <= d moves right
        while j < len(ys) and x - ys[j] > d:
            j += 1
        count += len(ys) - j
    return count


def kth_shift(xs: list[float], ys: list[float], k: int) -> float:
    """The k-th smallest (1-based) of every x - y, without forming the n·m of them: a bisection over the
    doubles' order (at most 64 steps), each counting in O(n + m). xs and ys sorted, finite."""
    lo, hi = _order_key(xs[0] - ys[-1]), _order_key(xs[-1] - ys[0])
    while lo < hi:  # the smallest d with at least k shifts <= d: it is one of the shifts
        mid = (lo + hi) // 2
        if _pairs_at_most(xs, ys, _from_key(mid)) >= k:
            hi = mid
        else:
            lo = mid + 1
    return _from_key(lo)


def shift_interval(
    xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """(low, high, confidence) for the shift x - y between two samples: Moses' interval (see the docstring).

    O((n + m) log(n + m)) in the windows: sorting, then two selections of a bisection each."""
    n, m = len(xs), len(ys)
    sx, sy = sorted(xs), sorted(ys)
    best, conf = _moses_k(n, m, confidence)
    return kth_shift(sx, sy, best), kth_shift(sx, sy, n * m - best + 1), conf


def ratio_interval(
    path_windows: Sequence[float], base_windows: Sequence[float], paired: bool = False
) -> tuple[float, float, float, str]:
    """(low, high, confidence, method) of the ratio path / baseline; see the module's docstring."""
    if paired and len(path_windows) == len(base_windows) and all(b > 0 for b in base_windows):
        lo, hi, conf = median_interval([p / b for p, b in zip(path_windows, base_windows)])
        return lo, hi, conf, "paired windows"
    if min(path_windows) <= 0 or min(base_windows) <= 0:
        return 0.0, math.inf, 0.0, "pairwise ratios"
    lo, hi, conf = shift_interval([math.log(v) for v in path_windows], [math.log(v) for v in base_windows])
    return math.exp(lo), math.exp(hi), conf, "pairwise ratios"


def baseline_for(results: dict[str, dict], path: str) -> dict | None:
    """The baseline a path's result is compared with: with --find-capacity, the baseline run at the demand of
    the path's own capacity probe (runner/capacity.py keeps that probe as the path's result); else the run's."""
    own = (results[path].get("capacity") or {}).get("baseline") if path != BASELINE else None
    return own or results.get(BASELINE)


def window_rates(result: dict) -> list[float]:
    """A path's images/s per timed window, in the order they ran (the median alone when no windows were kept)."""
    ips = result["images_per_sec"]
    return list(ips.get("repeats") or ips.get("windows") or [ips["median"]])


def uncertainty(result: dict, baseline: dict | None, is_baseline: bool = False) -> dict:
    """The `uncertainty` block of one path's result (docs/results.md)."""
    w = window_rates(result)
    lo, hi, conf = median_interval(w)
    med = statistics.median(w)
    steps = (result.get("schedule") or {}).get("timed_steps_per_window")
    out: dict = {
        "method": method_words(len(w)),
        "windows": len(w),
        "steps_per_window": steps,
        "step_s": ((result.get("step_time_ms") or {}).get("p50") or 0) / 1000 or None,  # the cost of more windows
        "confidence": conf,
        "images_per_sec": [lo, hi],
        "spread": (max(w) - min(w)) / med if med > 0 else None,
        "noisy": med > 0 and (max(w) - min(w)) / med > NOISY_SPREAD,
        "ratio": None,
        "ratio_method": None,
        "ratio_confidence": None,
        "within_noise": None,
        "windows_needed": None,
        "reading": "baseline" if is_baseline else None,
    }
    if is_baseline or baseline is None:
        return out
    bw = window_rates(baseline)
    alternated = result.get("interleaved")
    if alternated:  # --interleave: pairs of runs back to back (harness/interleave.py); their ratios are paired
        w, bw = alternated["images_per_sec"], alternated["baseline_images_per_sec"]
        rlo, rhi, rconf, _ = ratio_interval(w, bw, paired=True)
        how = f"alternating runs ({alternated['pairs']} pairs)"
    else:
        rlo, rhi, rconf, how = ratio_interval(w, bw)
    out.update(ratio=[rlo, rhi], ratio_method=how, ratio_confidence=rconf)
    if len(w) < 2 or len(bw) < 2:  # no spread: no interval to speak of
        out.update(ratio=None, ratio_method=None, ratio_confidence=None, reading=ONE_WINDOW)
        return out
    within = rlo <= 1.0 <= rhi
    ratio = med / statistics.median(bw) if statistics.median(bw) > 0 else 0.0
    out["within_noise"] = within
    if within:
        out["reading"] = WITHIN_NOISE
        need = windows_needed(w, bw, ratio)
        # The estimate is rough: when it says the run already had enough, ask for twice as many.
        out["windows_needed"] = max(need, 2 * len(w)) if need is not None and need <= len(w) else need
    else:
        out["reading"] = "slower than baseline" if rhi < 1.0 else "faster than baseline"
    return out


def apply_ceiling(blocks: dict[str, dict]) -> float:
    """Widen every ratio's interval by the drift between runs that a path above the ceiling proves.

    The on-device baseline is the ceiling: no input path can truly beat data already on the device. A path
    whose whole ratio interval lies above 1.0 therefore shows that the machine ran the baseline slower than
    that path by at least the interval's low end — a change of load between runs, which no path's own windows
    see. Every comparison of the run is then uncertain by that factor too: each ratio interval [lo, hi]
    becomes [lo / drift, hi · drift] and is judged again; more windows would not help (`windows_needed` is
    dropped), interleaved measurement or a quieter machine would. Returns the drift (1.0: none seen).
    `blocks`: path -> its `uncertainty` block (the baseline's included), changed in place.
    """
    sequential = {p: u for p, u in blocks.items() if u.get("ratio") and "alternating" not in u["ratio_method"]}
    above, drift = max(((p, u["ratio"][0]) for p, u in sequential.items()), key=lambda x: x[1], default=(None, 1.0))
    if drift <= 1.0:
        return 1.0
    for u in sequential.values():  # a ratio from alternating runs saw the same load on both sides
        lo, hi = u["ratio"][0] / drift, u["ratio"][1] * drift
        u.update(ratio=[lo, hi], drift=drift, drift_from=above, windows_needed=None, within_noise=lo <= 1.0 <= hi)
        u["ratio_method"] = f"{u['ratio_method']}, widened by the drift between runs (x{drift:.2f})"
        u["reading"] = WITHIN_NOISE if u["within_noise"] else "slower than baseline"
    return drift


def too_short_words(u: dict | None) -> str | None:
    """`run too short to tell: 12 windows of 4 steps would be needed`, or None when it need not be said."""
    if u and u.get("within_noise") and u.get("drift"):
        return (
            f"the machine's load changed between the runs ({drift_words(u)}): more windows would not tell; "
            "a quieter machine or --interleave N would"
        )
    if not u or not u.get("within_noise") or not u.get("windows_needed"):
        return None
    steps = f" of {u['steps_per_window']} steps" if u.get("steps_per_window") else ""
    n = u["windows_needed"]
    words = f"run too short to tell: {n} windows{steps} would be needed"
    if u.get("step_s") and u.get("steps_per_window"):  # what that costs in time, and whether it is worth it
        minutes = n * u["steps_per_window"] * u["step_s"] / 60
        words += f", about {_duration(minutes)} for this path"
        if minutes > WORTH_MINUTES:
            return f"{words}; not worth it: the difference is too small to matter, or run --interleave N on a quieter machine"
    return f"{words} (--repeats)"


WORTH_MINUTES = 30  # past this, more windows to tell a path from the baseline is not advised


def _duration(minutes: float) -> str:
    return (
        f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.0f} h"
    )


def drift_words(u: dict) -> str:
    """`python-queue ran at least 1.003x the on-device baseline, which is the ceiling`: the drift, and its path."""
    who = u.get("drift_from") or "a path"
    return f"{who} ran at least {u['drift']:.3g}x the on-device baseline, which is the ceiling"
