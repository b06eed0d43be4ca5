"""How often each core is taken away from a pinned process, and for how long.

One process per core, pinned to it as the executor pins ranks, reads the clock in a
tight loop for `--seconds`; every gap between two readings longer than 0.1 ms is time
the core ran something else (kernel threads, interrupts, the hypervisor). Per core:
gaps a second, those over 1 ms, the longest, the share of time lost, and how many of the
long gaps had one on another core within 2 ms (a pause of the whole VM rather than of
one core). A 3 ms gap is a third of a 10 ms step: on models whose steps are that short
the measured median step holds such gaps, which no prediction has (docs/accuracy.md,
"When not to trust a prediction"). How the kernel shares one core between two ranks is
`core_sharing.py`'s measurement.

    python benchmarks/core_interruptions.py [--seconds 5]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name  # noqa: E402

GAP = 1e-4       # seconds: a longer gap between clock readings is time taken away
LONG_GAP = 1e-3  # seconds


def clock_gaps(seconds: float) -> list[tuple[float, float]]:
    """(when, how long) in seconds of every gap over GAP while spinning for `seconds`."""
    end = time.perf_counter() + seconds
    last = time.perf_counter()
    gaps = []
    while last < end:
        now = time.perf_counter()
        if now - last > GAP:
            gaps.append((last, now - last))
        last = now
    return gaps


def coinciding(a: list[tuple[float, float]], b: list[tuple[float, float]], within: float = 2e-3) -> int:
    """How many gaps of `a` have a gap of `b` starting within `within` seconds."""
    starts = np.sort(np.array([w for w, _ in b])) if b else np.empty(0)
    if not len(starts):
        return 0
    at = np.searchsorted(starts, [w for w, _ in a])
    return sum(any(abs(starts[j] - w) < within for j in (i - 1, i) if 0 <= j < len(starts))
               for (w, _), i in zip(a, at))


def _spin(core: int, seconds: float, out: mp.Queue) -> None:
    os.sched_setaffinity(0, {core})
    out.put((core, clock_gaps(seconds)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="spin this long")
    args = ap.parse_args()
    if args.seconds <= 0:
        ap.error("--seconds must be > 0")
    ctx = mp.get_context("spawn")
    cores = sorted(os.sched_getaffinity(0))
    print(f"machine: {len(cores)} cores ({cpu_name()}), load average {os.getloadavg()[0]:.2f}; "
          f"one process spinning on each core for {args.seconds:g} s")
    out = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(c, args.seconds, out)) for c in cores]
    for p in procs:
        p.start()
    gaps = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    for c in cores:
        g = gaps[c]
        long = [x for x in g if x[1] > LONG_GAP]
        others = [x for k, v in gaps.items() if k != c for x in v if x[1] > LONG_GAP]
        longest = max((d for _, d in g), default=0.0)
        print(f"core {c}: {len(g) / args.seconds:6.1f} gaps/s over 0.1 ms, {len(long) / args.seconds:5.1f}/s over "
              f"1 ms, longest {1e3 * longest:5.2f} ms, {100 * sum(d for _, d in g) / args.seconds:5.2f} % of the "
              f"time lost; long gaps with one on another core within 2 ms: {coinciding(long, others)} of {len(long)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
