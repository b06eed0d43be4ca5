"""What running steps back to back without a barrier gains, per built-in schedule.

Simulated (exact, deterministic): every built-in at p = 8, m = 24 under F, B, W = 1, 1, 1
and 1, 2, 1 (no communication; the zero-bubble paper's profiled op times are not in
docs/ or ../shared/reference.md, so they are not used). For each schedule, with a barrier
between steps (every rank finishes a step before any starts the next) and without one
(`simulator.steps`):

- bubble per rank as the zero-bubble paper counts it, (span - busy) / span with span
  from the rank's first F to its last op, the worst rank; with a barrier over one step,
  without one in the steady state, where a rank's span per step is the period:
  1 - busy / period;
- the period (seconds per step once the pattern repeats; with a barrier the makespan),
  and the ratio of the period without a barrier to the period with one.

With --run, also measures the executor (gloo on this machine's CPUs, the example MLP,
p = 2, m = 8): the period (median of rank 0's step-start differences) of 1F1B and ZB-H2
with and without the barrier, over --steps steps, --repeats launches of each in turn
(a shared 2-core machine moves a launch's period by tens of percent: compare ratios).

Usage: python benchmarks/step_barrier.py [--run] [--steps 20] [--repeats 3] [-p 8] [-m 24]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from pipesched.schedules.ir import OPS
from pipesched import build
from pipesched.schedules.registry import BUILDERS
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, StageCost
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.trace import COMPUTE

COSTS = {"F,B,W = 1,1,1": (1.0, 1.0, 1.0), "F,B,W = 1,2,1": (1.0, 2.0, 1.0)}


def zb_bubble(trace) -> float:
    """The worst rank's (span - busy) / span, span from its first F to its last op."""
    worst = 0.0
    for r in range(trace.ranks):
        mine = (trace.lane == COMPUTE) & (trace.rank == r)
        forwards = mine & (trace.op == OPS.index("F"))
        span = float(trace.end[mine].max() - trace.start[forwards].min())
        busy = float((trace.end[mine] - trace.start[mine]).sum())
        worst = max(worst, (span - busy) / span)
    return worst


def simulated(p: int, m: int) -> None:
    for label, (f, b, w) in COSTS.items():
        costs = CostModel(stages=(StageCost(f, b, w),))
        print(f"\nsimulated, p={p}, m={m}, {label}, no communication (ideal step m(F+B+W) = {m * (f + b + w):g} s)")
        print(f"{'schedule':<18}{'bubble, barrier':>16}{'period, barrier':>17}{'bubble, none':>14}"
              f"{'period, none':>14}{'ratio':>8}  set by")
        for name in BUILDERS:
            try:
                schedule = build(name, p, m, costs=costs)
            except ValueError as exc:
                print(f"{name:<18}skipped: {exc}")
                continue
            graph = validate(schedule)
            one = simulate(graph, costs, engine="exact")
            steady = simulate(graph, costs, engine="exact", step_barrier="none")
            info = steady.meta["steps"]
            barrier_period = compute_metrics(one).makespan
            busy = np.zeros(p)
            comp = one.lane == COMPUTE
            np.add.at(busy, one.rank[comp], one.end[comp] - one.start[comp])
            steady_bubble = float(1 - busy.min() / info["period"])
            critical = ", ".join(info["critical"][:3]) + (", ..." if len(info["critical"]) > 3 else "")
            print(f"{name:<18}{100 * zb_bubble(one):>15.2f}%{barrier_period:>16.4g}s{100 * steady_bubble:>13.2f}%"
                  f"{info['period']:>13.4g}s{info['period'] / barrier_period:>8.3f}  {critical}")


def measured(steps: int, repeats: int) -> None:
    from pipesched.executor.job import RunOptions, launch
    from pipesched.executor.models import ExampleModel
    from pipesched.executor_args import DEFAULT_HIDDEN, DEFAULT_MICROBATCH

    # what `pipesched run --model mlp` runs at p = 2: 2 blocks a rank
    model = ExampleModel("mlp", hidden=DEFAULT_HIDDEN["mlp"], layers_per_stage=2,
                         microbatch_size=DEFAULT_MICROBATCH["mlp"])
    print(f"\nmeasured: executor, gloo on CPU, example MLP ({model.hidden} hidden), p=2, m=8, {steps} steps "
          f"after 2 warm-up, {repeats} launches each, with and without the barrier in turn; period = median of "
          "rank 0's step-start differences")
    print(f"{'schedule':<10}{'barrier':>12}{'none':>12}{'ratio':>8}  ratio per pair of launches")
    for name in ("1f1b", "zb-h2"):
        schedule = build(name, 2, 8)  # unit op times: the order of the published schedule
        periods: dict[str, list[float]] = {"all": [], "none": []}
        for _ in range(repeats):
            for barrier in ("all", "none"):
                result = launch(schedule, model, RunOptions(steps=steps, warmup=2, step_barrier=barrier))
                assert result.check.loss_matches and result.check.grads_match, name
                periods[barrier].append(result.period)
        a, n = statistics.median(periods["all"]), statistics.median(periods["none"])
        pairs = " ".join(f"{y / x:.3f}" for x, y in zip(periods["all"], periods["none"]))
        print(f"{name:<10}{a * 1e3:>10.2f}ms{n * 1e3:>10.2f}ms{n / a:>8.3f}  {pairs}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--ranks", type=int, default=8)
    ap.add_argument("-m", "--microbatches", type=int, default=24)
    ap.add_argument("--run", action="store_true", help="also measure the executor at p = 2 (spawns ranks)")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per run with --run")
    ap.add_argument("--repeats", type=int, default=3, help="launches per schedule and barrier with --run")
    args = ap.parse_args()
    simulated(args.ranks, args.microbatches)
    if args.run:
        measured(args.steps, args.repeats)


if __name__ == "__main__":
    main()
