"""Ranks sharing a core: how often both compute at once, measured against predicted.

Where ranks outnumber the cores (p = 4 on this project's 2-core VM; rank r pinned to core
r mod cores), the simulation shares each core between its ranks. This reads the saved runs
of `accuracy_random.py` and, per schedule, prints the median over launches of the share of
a rank's compute-span time during which another rank of its core is also inside a compute
span, in the measured run and in its prediction (the default estimator, as
`accuracy_random.evaluate` computes it), beside the median signed makespan error. Where
the predicted share is well above the measured one, the simulation has the ranks of a
core computing together more often than the kernel lets them.

    python benchmarks/core_overlap.py benchmarks/results/accuracy_random_seed2047_runs.json.gz [...] [--cores 2]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_random as ar  # noqa: E402

from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.costs import from_dict as costs_from_dict  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.trace import COMPUTE, Trace  # noqa: E402


def compute_spans(trace: Trace, rank: int) -> list[tuple[float, float]]:
    """(start, end) seconds of the rank's compute spans, in order."""
    keep = (trace.lane == COMPUTE) & (trace.rank == rank)
    return sorted(zip(trace.start[keep], trace.end[keep]))


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds during which a span of `a` and one of `b` both run (each list sorted, spans disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def both_busy_share(trace: Trace, cores: int) -> float:
    """Over all ranks: compute time with another rank of the same core computing, over compute time."""
    spans = [compute_spans(trace, r) for r in range(trace.ranks)]
    busy = sum(e - s for rank in spans for s, e in rank)
    both = sum(overlap(spans[r], spans[q]) for r in range(trace.ranks) for q in range(trace.ranks)
               if q != r and q % cores == r % cores)
    return both / busy if busy > 0 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="runs files saved by accuracy_random.py --save-runs")
    ap.add_argument("--cores", type=int, default=2, help="cores of the machine the runs were made on")
    args = ap.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for path in args.runs:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for case in doc["cases"]:
            p = case["p"]
            if p <= args.cores:
                continue  # every rank has its own core: nothing is shared
            m = case["draw"]["m_per_p"][str(p)]
            solo = costs_from_dict(case["costs"])
            traces = {n: Trace.from_dict(t) for n, t in case["traces"].items()}
            steps = {n: [Trace.from_dict(t) for t in ts] for n, ts in case.get("calibration_steps", {}).items()}
            schedules = {n: build(n, p, m) for n in traces}
            costs = ar.default_costs(solo, *ar.calibration_runs(schedules, traces, steps))
            for name, measured in traces.items():
                predicted = ar.predict(schedules[name], costs)
                error = compute_metrics(predicted).makespan / compute_metrics(measured).makespan - 1
                rows.setdefault(name, []).append((both_busy_share(measured, args.cores),
                                                  both_busy_share(predicted, args.cores), error))
    if not rows:
        print(f"no launch with more ranks than {args.cores} cores in these runs")
        return 2
    print(f"{'schedule':<18} launches  both computing: measured  predicted   makespan error (median signed)")
    for name in ar.SCHEDULES:
        if name in rows:
            v = np.asarray(rows[name])
            print(f"{name:<18} {len(v):>8}  {statistics.median(v[:, 0]):>24.3f}  {statistics.median(v[:, 1]):>9.3f}"
                  f"   {100 * statistics.median(v[:, 2]):+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
