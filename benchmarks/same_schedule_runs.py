"""How well runs of one schedule agree in one launch: the floor under any comparison.

`validate A,B,...` holds schedules measured in one launch against each other, each run
with its own runtime (buffers, receive posting) and their steps taken in turn. Here one
schedule is opened as K such runs of the same model and stepped in turn, first in a
fixed order per round, then in an order shuffled every round (a run's place after
another could bias it). Printed per order: each run's median step over the fastest
run's, and each run's even steps' median over its odd ones' (the run against itself).
Where the runs' medians differ by more than their halves do, runs carry a bias of their
own that more steps do not remove.

    python benchmarks/same_schedule_runs.py [--hidden 256] [--microbatch-size 4] [--layers-per-stage 4]
                                           [--schedule 1f1b] [-p 2] [-m 8] [--runs 4] [--steps 40]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys

from pipesched.executor.job import OpenRun, RunOptions
from pipesched.executor.launch import RankContext, launch_local
from pipesched.executor.models import ExampleModel, ModelError
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import build

WARMUP = 2


def same_schedule(ctx: RankContext, name: str, p: int, m: int, model: ExampleModel, runs: int, steps: int,
                  shuffle: bool) -> list[list[float]] | None:
    """Collective: `runs` runs of one schedule on one built model, stepped in turn;
    rank 0 gets each run's measured step times (seconds)."""
    schedule = build(name, p, m)
    built = model.build(schedule.num_model_stages, m)
    opened = [OpenRun(ctx, schedule, model, RunOptions(steps=steps, warmup=WARMUP, min_time=0.0, check=False), built)
              for _ in range(runs)]
    order = random.Random(7)  # every rank draws the same orders
    try:
        for run in opened:
            while len(run.records) < WARMUP:
                run.step()
        for _ in range(steps):
            turn = list(range(runs))
            if shuffle:
                order.shuffle(turn)
            for i in turn:
                opened[i].step()
    finally:
        for run in opened:
            run.close()
    results = [run.finish() for run in opened]
    return [r.step_times for r in results] if ctx.rank == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--layers-per-stage", type=int, default=4)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    if not (2 <= args.runs <= 16 and 2 <= args.steps <= 1000 and 1 <= args.p <= 8 and args.m >= 1):
        ap.error("need 2-16 runs, 2-1000 steps, p 1-8 and m >= 1")
    try:
        model = ExampleModel(kind="mlp", hidden=args.hidden, layers_per_stage=args.layers_per_stage,
                             microbatch_size=args.microbatch_size).check()
        build(args.schedule, args.p, args.m)
    except (ModelError, ScheduleError) as e:
        ap.error(str(e))
    print(f"{args.schedule}, p {args.p}, m {args.m}, mlp hidden {args.hidden}, {args.layers_per_stage} blocks a stage, "
          f"microbatch {args.microbatch_size}: {args.runs} runs of {args.steps} steps in turn")
    for shuffle in (False, True):
        steps = launch_local(same_schedule, (args.schedule, args.p, args.m, model, args.runs, args.steps, shuffle),
                             args.p)
        medians = [statistics.median(s) for s in steps]
        halves = [statistics.median(s[0::2]) / statistics.median(s[1::2]) - 1 for s in steps]
        fastest = min(medians)
        print(f"{'order shuffled each round' if shuffle else 'fixed order'}: median step "
              f"{1e3 * statistics.median(medians):.1f} ms; each run's median over the fastest run's "
              + " ".join(f"{100 * (x / fastest - 1):+.2f}%" for x in medians)
              + "; each run's even steps over its odd ones " + " ".join(f"{100 * h:+.1f}%" for h in halves),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
