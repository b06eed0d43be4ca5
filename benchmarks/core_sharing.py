"""How this machine's kernel shares one core between two pinned ranks (Linux only).

The simulator models ranks that share a core by processor sharing (both stretched
evenly). This measures what the scheduler really does, with one-thread matrix-multiply
ops of about 6 ms, all processes pinned to core 0:
  alone       an op with the core to itself;
  woken       a rank that sleeps `gap` between ops (as a rank waiting for data does)
              next to one that computes without pause: its op time and the busy one's;
  both busy   two ranks computing without pause.
Processor sharing predicts 2x alone for a shared op; round-robin with quantum q and
woken-runs-first predicts alone + q for the woken rank (when alone < 2q).

    python benchmarks/core_sharing.py [--op-ms 6] [--seconds 3]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

SIZE = 256


def _ops(repeats: int) -> None:
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    for _ in range(repeats):
        a @ b


def _pin() -> None:
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)


def _worker(label: str, repeats: int, seconds: float, gap: float, out: mp.Queue) -> None:
    """Run ops for `seconds`, sleeping `gap` before each (0: never); report op times (s)."""
    _pin()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if gap:
            time.sleep(gap)
        start = time.perf_counter()
        _ops(repeats)
        times.append(time.perf_counter() - start)
    out.put((label, times))


def _together(specs: list[tuple[str, float]], repeats: int, seconds: float) -> dict[str, list[float]]:
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_worker, args=(label, repeats, seconds, gap, out)) for label, gap in specs]
    for p in procs:
        p.start()
    got: dict[str, list[float]] = {}
    for _ in procs:
        label, times = out.get()
        got.setdefault(label, []).extend(times)
    for p in procs:
        p.join()
    return got


def _summary(times: list[float]) -> str:
    s = sorted(times)
    return (f"median {1e3 * statistics.median(s):6.2f} ms  p10 {1e3 * s[len(s) // 10]:6.2f}  "
            f"p90 {1e3 * s[9 * len(s) // 10]:6.2f}  ({len(s)} ops)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op-ms", type=float, default=6.0, help="target op time alone, ms (default 6)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per experiment (default 3)")
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        print("needs Linux (os.sched_setaffinity)", file=sys.stderr)
        return 2
    _pin()
    start = time.perf_counter()
    _ops(50)
    repeats = max(1, round(args.op_ms / 1e3 / ((time.perf_counter() - start) / 50)))
    alone = []
    for _ in range(30):
        start = time.perf_counter()
        _ops(repeats)
        alone.append(time.perf_counter() - start)
    base = statistics.median(alone)
    print(f"alone:                 {_summary(alone)}")
    print(f"processor sharing would give {2e3 * base:.2f} ms per shared op")
    for gap in (0.002, 0.010, 0.030):
        got = _together([("woken", gap), ("busy", 0.0)], repeats, args.seconds)
        print(f"woken (sleeps {1e3 * gap:2.0f} ms): {_summary(got['woken'])};  "
              f"woken - alone = {1e3 * (statistics.median(got['woken']) - base):.2f} ms")
        print(f"  its busy neighbour:  {_summary(got['busy'])}")
    got = _together([("busy", 0.0), ("busy", 0.0)], repeats, args.seconds)
    print(f"both busy:             {_summary(got['busy'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
