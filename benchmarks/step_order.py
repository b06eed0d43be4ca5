"""Does a step run slower for what ran before it? One launch, runs taking steps in turn.

`validate` measures the validated schedule in turn with its calibration runs (a step of
each, round after round: `executor.job.run_in_turn`), so a host whose speed drifts slows
them alike. That holds only if a step's time does not depend on which run's step came
before it. Here the same schedule appears twice in the round (`--order`, default as
`validate 1f1b` orders its runs: 1F1B, ZB-H1, ZB-V, then the validated 1F1B), each
copy with its own runtime and model, and every step is timed on rank 0. Printed: each
run's median and mean step (ms) and spread (interquartile range over the median), and
the last copy's steps over the first copy's, paired by round: the same schedule, the
same rounds, only the step before differs. With `--pairs`, each run takes two steps in
a row per round instead, and the first of each pair (after another run's step) is
compared with the second (after its own).

With data parallelism each run's all-reduce buffers are part of what a step before can
disturb: a new bucket buffer every step made the copy after ZB-V 1.7-4.0 % slower (mean
steps) and the mean step 2-10 % over the median; with each bucket's buffer kept, under
1.1 % and within 1 % (docs/data_parallel.md, 2026-11-26, eighth session).

    python benchmarks/step_order.py [--dp 2] [--rounds 40] [--order 1f1b,zb-h1,zb-v,1f1b] [--pairs]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.run_costs import relative_iqr  # noqa: E402


def paired_ratios(later: list[float], earlier: list[float]) -> list[float]:
    """Per round, the later step's time over the earlier one's."""
    if len(later) != len(earlier):
        raise ValueError(f"{len(later)} steps against {len(earlier)}: pair them by round")
    return [b / a for a, b in zip(earlier, later)]


def job(ctx, names: list[str], p: int, m: int, dp: int, rounds: int, pairs: bool, model) -> list | None:
    """Collective: every run opened, two warm-up steps each, then `rounds` rounds; rank 0
    returns each run's measured step times (seconds), and with `pairs` (first, second)."""
    from pipesched.executor.job import OpenRun, RunOptions

    runs = []
    try:
        for name in names:
            schedule = build(name, p, m)
            per_rank = schedule.num_model_stages // p
            runs.append(OpenRun(ctx, schedule, replace(model, layers_per_stage=model.layers_per_stage // per_rank),
                                RunOptions(steps=1, warmup=0, dp=dp)))
        for run in runs:
            run.step()
            run.step()
        times: list[list[float]] = [[] for _ in runs]
        for _ in range(rounds):
            for i, run in enumerate(runs):
                for _ in range(2 if pairs else 1):
                    run.step()
                    times[i].append(run.records[-1].end - run.records[-1].start)
    finally:
        for run in runs:
            run.close()
    return times if ctx.rank == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", default="1f1b,zb-h1,zb-v,1f1b", help="the runs of a round, in order")
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--pairs", action="store_true", help="two steps of each run in a row per round")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--microbatch-size", type=int, default=32)
    args = ap.parse_args()

    from pipesched.executor.launch import launch_local
    from pipesched.executor.models import ExampleModel

    names = args.order.split(",")
    model = ExampleModel("mlp", args.hidden, 2, args.microbatch_size)  # 2 blocks a rank, as the CLI's default
    times = launch_local(job, (names, args.p, args.m, args.dp, args.rounds, args.pairs, model),
                         args.p * args.dp, timeout=600)
    print(f"{args.p} x {args.dp} ranks, mlp hidden {args.hidden}, microbatch {args.microbatch_size}, m {args.m}, "
          f"{args.rounds} rounds{', steps in pairs' if args.pairs else ''}")
    for i, (name, t) in enumerate(zip(names, times)):
        print(f"{i} {name:18} median {1e3 * statistics.median(t):7.1f} ms  mean {1e3 * statistics.mean(t):7.1f} ms  "
              f"spread {100 * relative_iqr(t):4.1f} %")
    if args.pairs:
        for name, t in zip(names, times):
            r = paired_ratios(t[0::2], t[1::2])
            print(f"{name}: after another run's step over after its own, paired median {statistics.median(r):.3f}, "
                  f"slower in {sum(x > 1 for x in r)} of {len(r)}")
    else:
        r = paired_ratios(times[-1], times[0])
        print(f"last run ({names[-1]}) over the first ({names[0]}): paired median {statistics.median(r):.3f}, "
              f"mean steps {statistics.mean(times[-1]) / statistics.mean(times[0]):.3f}, "
              f"slower in {sum(x > 1 for x in r)} of {len(r)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
