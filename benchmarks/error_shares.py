"""Where a prediction's error sits: the calibration's op times, op times per kind, or the simulator.

Reads the folders `validate A,B,... --out DIR` writes (`NAME/costs.json`,
`NAME/predicted.json`, `NAME/measured.json`; `validate_many.py --out` keeps one such
folder per model) and splits each run's error, predicted / measured - 1, into a chain
of simulations of the same schedule under the same cost model (its links and host time
outside ops), each changing one thing:

    predicted     the cost model's op times (what `validate` printed)
    unscaled      the same without the step residual (`simulator.run_costs`)
    stage means   every op the mean of the run's own ops of its kind and model stage
    own means     every op the mean of the run's own ops of its kind, model stage and rank
    shuffled      every op a duration the run measured for its kind, model stage and rank,
                  drawn without replacement (the median makespan of 16 draws)
    own ops       every op its own measured duration
    measured      the run's step

    residual   = predicted / unscaled - 1: the step residual, which scales every op and
                 the host time between ops
    op times   = unscaled / stage means - 1: the calibration's op times against this
                 schedule's own (positive: the cost model's are longer)
    ranks      = stage means / own means - 1: where one model stage runs on several
                 ranks (DualPipe's copies), how far their ranks ran it apart
    noise      = own means / shuffled - 1: what op-to-op variation alone adds to a step
                 (negative: a step over noisy ops is longer than over their means)
    placement  = shuffled / own ops - 1: what a time per op kind misses of where each
                 op sits (the step's first op, forwards in a row, a stage switch)
    rest       = own ops / measured - 1: the simulator's own share (dependencies,
                 posting, host time and links as the cost model has them)

so (1 + error) = the product of (1 + share). Where ranks share cores, every
simulation shares them again, and op durations are first turned into dedicated work
(`simulator.dedicated`), as calibration does; `rest` then also holds how far the
simulated core sharing is from the kernel's. Printed per schedule: the median of each
share over the runs found.

Then, for runs that hold copies of one model stage on ranks of different cores
(DualPipe's two directions), how fast the cores ran the same work: per op kind and model
stage, the mean (dedicated) op time on core 0 over that on core 1, their median per run.
The calibration runs place model stage k on rank k only, so a core slower than the other
for a whole launch reads as slow stages there, and a schedule that places every stage on
every core is predicted as if its cores were alike.

    python benchmarks/error_shares.py DIR [DIR ...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from op_context import run_folders  # noqa: E402

from pipesched.schedules.graph import TaskGraph  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402
from pipesched.simulator.cost_file import load as load_costs  # noqa: E402
from pipesched.simulator.costs import CostModel  # noqa: E402
from pipesched.simulator.dedicated import dedicated_durations, shares_cores  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.replay import ReplayError, task_spans  # noqa: E402
from pipesched.simulator.api import simulate  # noqa: E402
from pipesched.simulator.run_costs import group_means, op_groups  # noqa: E402
from pipesched.simulator.trace import Trace, TraceError  # noqa: E402

SHARES = ("error", "residual", "op times", "ranks", "noise", "placement", "rest")
DRAWS = 16


def makespan(graph: TaskGraph, costs: CostModel, task_times: np.ndarray | None = None) -> float:
    """Seconds: `graph` simulated under `costs`, every op `task_times` long where given."""
    return compute_metrics(simulate(graph, costs, task_times=task_times)).makespan


def shares(graph: TaskGraph, costs: CostModel, measured: Trace, rng: np.random.Generator) -> dict[str, float]:
    """The error of `costs`'s prediction of `measured` and its shares (module docstring)."""
    span = task_spans(graph, measured)
    if (span < 0).any():
        raise ReplayError(f"the trace lacks {int((span < 0).sum())} of the schedule's tasks")
    shared = costs.host is not None and shares_cores(costs.host, measured.ranks)
    durations = dedicated_durations(measured, costs.host) if shared else measured.end - measured.start
    own = durations[span]
    members = op_groups(graph)
    base = costs.slower(1 / costs.meta.get("from_runs", {}).get("residual", 1.0))
    draws = []
    for _ in range(DRAWS):
        drawn = own.copy()
        for idx in members:
            drawn[idx] = own[rng.permutation(idx)]
        draws.append(makespan(graph, base, drawn))
    predicted, unscaled = makespan(graph, costs), makespan(graph, base)
    by_stage = makespan(graph, base, group_means(own, op_groups(graph, by_rank=False)))
    by_means = makespan(graph, base, group_means(own, members))
    shuffled, by_ops = statistics.median(draws), makespan(graph, base, own)
    step = compute_metrics(measured).makespan
    return {"error": predicted / step - 1, "residual": predicted / unscaled - 1, "op times": unscaled / by_stage - 1,
            "ranks": by_stage / by_means - 1,
            "noise": by_means / shuffled - 1, "placement": shuffled / by_ops - 1, "rest": by_ops / step - 1}


def core_ratio(graph: TaskGraph, costs: CostModel, measured: Trace) -> float | None:
    """The same ops' mean (dedicated) time on core 0 over core 1 (median over op kinds
    and model stages that ran on both); None where no model stage ran on two cores. Ranks
    are pinned to core rank mod capacity where they share cores, else one core each."""
    span = task_spans(graph, measured)
    if (span < 0).any():
        return None
    col, sched = graph.columns(), graph.schedule
    shared = costs.host is not None and shares_cores(costs.host, measured.ranks)
    took = (dedicated_durations(measured, costs.host) if shared else measured.end - measured.start)[span]
    core = col["rank"] % int(costs.host.capacity) if shared else col["rank"]
    model = np.asarray([s.model_stage for s in sched.stages], dtype=np.int64)[col["stage"]]
    logs = []
    for k in range(sched.num_model_stages):
        for op in np.unique(col["op"]):
            of = (model == k) & (col["op"] == op)
            a, b = took[of & (core == 0)], took[of & (core == 1)]
            if len(a) and len(b) and b.mean() > 0 and a.mean() > 0:
                logs.append(np.log(a.mean() / b.mean()))
    return float(np.exp(np.median(logs))) if logs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders written by validate --out (searched below)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffled draws (default 0)")
    args = ap.parse_args()
    folders = [f for f in run_folders(args.dirs) if (f / "costs.json").exists()]
    if not folders:
        print("error_shares: no costs.json, predicted.json and measured.json together under "
              + ", ".join(map(str, args.dirs)), file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    found: dict[str, list[dict[str, float]]] = defaultdict(list)
    cores: list[tuple[Path, float, float]] = []
    for folder in folders:
        try:
            measured = Trace.load(folder / "measured.json")
            costs = load_costs(folder / "costs.json")
            graph = validate(build(folder.name, measured.ranks, measured.microbatches))
            split = shares(graph, costs, measured, rng)
        except (OSError, TraceError, ValueError) as e:  # not a built-in schedule, or costs of another run
            print(f"error_shares: {folder}: skipped ({e})", file=sys.stderr)
            continue
        found[folder.name].append(split)
        ratio = core_ratio(graph, costs, measured)
        if ratio is not None:
            cores.append((folder, ratio, split["error"]))
    if not found:
        print("error_shares: no run could be split", file=sys.stderr)
        return 2
    print(f"{sum(map(len, found.values()))} runs; median over runs, makespan ratios - 1 "
          "(error = product of the shares: predicted / measured)")
    print(f"{'schedule':18s}" + "".join(f"{s:>11s}" for s in SHARES) + "   runs")
    for name in sorted(found):
        rows = found[name]
        print(f"{name:18s}" + "".join(f"{statistics.median(r[s] for r in rows):>+11.2%}" for s in SHARES)
              + f"   {len(rows):4d}")
    if cores:
        print("\nruns with one model stage on two cores: the same ops' time on core 0 over core 1, and the error")
        for folder, ratio, error in cores:
            print(f"{str(folder):44s}{ratio:7.3f}   {error:+7.2%}")
        apart = [abs(np.log(r)) for _, r, _ in cores]
        print(f"median |log(core 0 / core 1)| {statistics.median(apart):.3f} over {len(cores)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
