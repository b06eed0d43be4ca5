"""Side by side: pipesched's schedules against torch.distributed.pipelining's of the same
name, in pipesched's simulator, under equal and unequal F/B/W costs.

For each schedule both projects have, prints our makespan and peak activation memory
against torch's order (imported from torch's own schedule classes), as a Markdown
table; --json writes the rows for the README figure. Costs are per pipeline stage,
no communication; activation memory is 1 unit per microbatch per pipeline stage, so
peak memory reads as "microbatches' worth". Cost-adaptive builders (zb-v) are built
for the costs of each column.
Usage: python benchmarks/vs_torch_report.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json

from executor.torch_schedules import torch_schedule
from schedules.ir import ScheduleError
from schedules.registry import build
from schedules.validate import validate
from simulator.api import simulate
from simulator.costs import uniform
from simulator.metrics import compute_metrics

PAIRS = [("gpipe", "GPipe", None), ("1f1b", "1F1B", None), ("interleaved-1f1b", "Interleaved1F1B", 2),
         ("looped-bfs", "LoopedBFS", 2), ("zb-v", "ZBVZeroBubble", None), ("dualpipev", "DualPipeV", None)]
COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1)]
SIZES = [(4, 8), (4, 16), (8, 32), (4, 10)]


def measure(schedule, f: float, b: float, w: float) -> tuple[float, float]:
    graph = validate(schedule)
    m = compute_metrics(simulate(graph, uniform(f, b, w, activation_memory=1.0), engine="exact"))
    return m.makespan, max(r.peak_memory_bytes for r in m.per_rank)


def rows() -> list[dict]:
    out = []
    for ours, theirs, v in PAIRS:
        for p, m in SIZES:
            try:
                reference = torch_schedule(theirs, p, m, v)
            except ScheduleError as exc:
                out.append({"schedule": ours, "torch": theirs, "p": p, "m": m, "v": v, "refused": str(exc)})
                continue
            for f, b, w in COSTS:
                costs = uniform(f, b, w)
                mine = build(ours, p, m, v, op_time=costs.op_time_for(p))
                ms, mem = measure(mine, f, b, w)
                ts, tmem = measure(reference, f, b, w)
                out.append({"schedule": ours, "torch": theirs, "p": p, "m": m, "v": v, "costs": [f, b, w],
                            "makespan": ms, "torch_makespan": ts, "peak_memory": mem, "torch_peak_memory": tmem})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT.json", help="also write the rows as JSON")
    args = parser.parse_args()
    data = rows()
    print("| schedule (torch) | p | m | F,B,W | makespan ours / torch | ratio | peak act. ours / torch |")
    print("|---|---|---|---|---|---|---|")
    for r in data:
        name = f"{r['schedule']} ({r['torch']}{'' if r['v'] is None else f', v={r[chr(118)]}'})"
        if "refused" in r:
            print(f"| {name} | {r['p']} | {r['m']} | all | torch refuses: {r['refused'].split(': ', 1)[-1]} | | |")
            continue
        f, b, w = r["costs"]
        print(f"| {name} | {r['p']} | {r['m']} | {f:g},{b:g},{w:g} | {r['makespan']:g} / {r['torch_makespan']:g} | "
              f"{r['makespan'] / r['torch_makespan']:.3f} | {r['peak_memory']:g} / {r['torch_peak_memory']:g} |")
    worse = [r for r in data if "refused" not in r and r["makespan"] > r["torch_makespan"] + 1e-9]
    more_memory = [r for r in data if "refused" not in r and r["peak_memory"] > r["torch_peak_memory"] + 1e-9]
    print(f"\nslower than torch: {len(worse)} of {sum('refused' not in r for r in data)} cases; "
          f"more peak memory than torch: {len(more_memory)}")
    for r in more_memory:
        print(f"  more memory: {r['schedule']} p={r['p']} m={r['m']} costs={r['costs']}: "
              f"{r['peak_memory']:g} vs {r['torch_peak_memory']:g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(data, fh, indent=1)


if __name__ == "__main__":
    main()
