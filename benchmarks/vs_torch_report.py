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

from pipesched.executor.torch_schedules import compare_with_torch
from pipesched.simulator.costs import uniform

COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1)]
SIZES = [(4, 8), (4, 16), (8, 32), (4, 10)]


def rows() -> list[dict]:
    out = []
    for p, m in SIZES:
        for f, b, w in COSTS:
            for row in compare_with_torch(p, m, uniform(f, b, w, activation_memory=1.0)):
                if "refused" in row and any(r.get("refused") and r["schedule"] == row["schedule"] and
                                            (r["p"], r["m"]) == (p, m) for r in out):
                    continue
                out.append({**row, "costs": [f, b, w]})
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
            print(f"| {name} | {r['p']} | {r['m']} | all | {r['refused']} | | |")
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
