"""The whole data-parallel step, predicted against measured, as a user runs it: the
`pipesched validate SCHEDULE -p P -m M --dp D --replay --json` command, end to end (two
launches each: solo profiles on p ranks, then the data-parallel calibration and the
run, in turn with the calibration runs, on p x d ranks), for each schedule, `--repeats`
times.

Printed per run: the makespan error, the replay error, the bubble and the exposed
all-reduce (predicted / measured), the measured makespan, the spread of its steps
(interquartile range over the median), how far the mean of its even steps is from that
of its odd ones (two halves of one measurement, each held as `validate --dp` holds the
run: by its mean step; no prediction can be expected to agree with the measurement
better than that) and the command's wall time; then the median and
max |makespan error| and of the halves' difference over the runs, and with `--repeats` 2 or
more how far each schedule's launches are from that schedule's median launch. The target on
this 2-core machine (4 processes on 2 cores) is the p = 4 one: median <= 3 %, max <= 8 %.

    python benchmarks/validate_dp.py [--schedules 1f1b,zb-h1,...] [--repeats 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli_run import run_json  # noqa: E402

SCHEDULES = "1f1b,zb-h1,gpipe,interleaved-1f1b,zb-v,dualpipev"


def launches_apart(measured: dict[str, list[float]]) -> list[float]:
    """|launch / median - 1| for every launch of a schedule launched more than once, the
    median over that schedule's launches: how the same command repeats from launch to
    launch, what a cost file calibrated in one launch would meet in another (`validate`
    calibrates in the launch it measures, so it follows the host's drift between launches;
    within a launch the even and odd steps' halves say how the measurement repeats)."""
    return [abs(m / statistics.median(ms) - 1) for ms in measured.values() if len(ms) > 1 for m in ms]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", default=SCHEDULES)
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, help="keep each run's folder (costs, traces) here")
    ap.add_argument("extra", nargs="*", help="more validate flags after --, e.g. -- --op-times solo")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="validate-dp-"))
    errors, halves = [], []
    measured: dict[str, list[float]] = {}  # schedule -> each launch's measured makespan (seconds)
    print(f"{'run':24} {'error':>7} {'replay':>7} {'bubble p/m':>11} {'exposed p/m ms':>15} {'measured':>9} "
          f"{'spread':>7} {'halves':>7} {'wall':>6}")
    for rep in range(args.repeats):
        for name in args.schedules.split(","):
            folder = out / f"{name}.{rep + 1}"
            cmd = ["pipesched", "validate", name, "-p", str(args.p), "-m", str(args.m), "--dp", str(args.dp),
                   "--replay", "--json", "--out", str(folder), *args.extra]
            d, wall = run_json(cmd, f"{folder.name:24}", env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if d is None:
                continue
            dp = d["data_parallel"]
            errors.append(abs(d["makespan_rel_error"]))
            measured.setdefault(name, []).append(d["measured"]["makespan"])
            halves.append(d["measured_halves_apart"] if d["measured_halves_apart"] is not None else float("nan"))
            print(f"{folder.name:24} {100 * d['makespan_rel_error']:+6.1f}% {100 * d['replay_makespan_rel_error']:+6.1f}% "
                  f"{100 * d['predicted']['bubble_ratio']:5.0f}/{100 * d['measured']['bubble_ratio']:<5.0f} "
                  f"{1e3 * dp['predicted_exposed']:7.0f}/{1e3 * dp['measured_exposed']:<7.0f} "
                  f"{1e3 * d['measured']['makespan']:7.0f}ms {100 * (d['measured_steps_spread'] or 0.0):6.1f}% "
                  f"{100 * halves[-1]:6.1f}% {wall:5.0f}s", flush=True)
    if errors:
        print(f"|makespan error| over {len(errors)} runs: median {100 * statistics.median(errors):.2f} %, "
              f"max {100 * max(errors):.2f} %  (runs kept in {out})")
        print(f"|even / odd steps - 1| over the same runs: median {100 * statistics.median(halves):.2f} %, "
              f"max {100 * max(halves):.2f} %")
        apart = launches_apart(measured)
        if apart:
            print(f"|launch / the schedule's median launch - 1| (the same command measured again): "
                  f"median {100 * statistics.median(apart):.2f} %, max {100 * max(apart):.2f} %")
    return 0 if errors else 1


if __name__ == "__main__":
    sys.exit(main())
