"""Prediction accuracy on models nobody tuned for: configurations drawn from a seeded
generator (`random_models.py`), every schedule predicted from ONE calibration and then run.

For each drawn model and each p, one launch of the ranks:

1. calibrates once (`executor.calibrate`: solo profiles, ping-pong) on the v = 1 split;
2. runs every schedule on the same model (v = 2 schedules get half the layers per
   model stage, so every schedule runs the same network) at one m drawn from p..8p, a
   step of each in turn (`executor.job.run_in_turn`), so that the host's drift slows
   them alike.

A launch the launcher stops because the host runs out of memory (every schedule's model is
built at once) is reported as not measured, and the next one goes on.

Then every run is predicted as `validate` predicts it: from the solo calibration ("solo"),
and from costs read from every measured step of the runs of 1F1B and ZB-H1 and, at the
other split, ZB-V ("runs", what `--op-times runs` does; those three are marked * in the
table). Each run is also replayed (simulated with its own op and transfer times: the
simulator's own error; "replay-c" with the calibrated host time). Printed per run: measured
makespan, the errors and the spread of its measured steps (interquartile range over the
median); per p: median and max |error| over all runs and over the schedules not used to
calibrate, how often the predicted fastest measured within 2 % of the measured fastest,
and the measurement against itself (each run's even and odd steps as two measurements).

    python benchmarks/accuracy_random.py --seed 1 --models 8 [--ranks 2,4] [--save-runs RUNS.npz]
    python benchmarks/accuracy_random.py --from-runs RUNS.npz [--json SUMMARY.json]   # evaluate saved runs again
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name  # noqa: E402
from random_models import CALIBRATION_RUNS, OTHER_SPLIT_RUN, RANKING_TOLERANCE, SCHEDULES, Draw, draw_models  # noqa: E402
import saved_runs  # noqa: E402

from pipesched.schedules.ir import ScheduleError  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.compare import compare  # noqa: E402
from pipesched.simulator.costs import CostModel, from_dict as costs_from_dict, to_dict  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.replay import replay  # noqa: E402
from pipesched.simulator.run_costs import costs_from_runs, relative_iqr, step_halves  # noqa: E402
from pipesched.simulator.trace import Trace  # noqa: E402

LOOKAHEAD = 2


def measure_model(ctx, p: int, draw: Draw, calibration, options):
    """One launch: calibrate once (v = 1), then run every schedule that builds at this m.
    Rank 0 returns (costs, {name: RunResult}, {name: why skipped})."""
    from pipesched.executor.calibrate import calibrate_here
    from pipesched.executor.job import run_in_turn

    m = draw.m_per_p[p]
    costs = calibrate_here(ctx, build("1f1b", p, m), draw.model(1), calibration)
    built, skipped = {}, {}
    for name in SCHEDULES:
        try:
            built[name] = build(name, p, m)
        except ScheduleError as exc:
            skipped[name] = str(exc)
    # a step of each schedule in turn, as validate runs its calibration: drift slows all alike
    runs = run_in_turn(ctx, [(s, draw.model(s.num_model_stages // p), options) for s in built.values()])
    return (costs, dict(zip(built, runs)), skipped) if ctx.rank == 0 else None


@dataclass(frozen=True)
class SavedCase:
    """One launch of a `--save-runs` file: model `model` at `p`, its solo calibration, the
    median step of every schedule's run, and every step of the calibration runs."""

    model: int
    p: int
    draw: Draw
    costs: CostModel
    traces: dict
    steps: dict


def saved_cases(doc: dict):
    """The launches of a loaded `--save-runs` document, as `SavedCase`s."""
    for case in doc["cases"]:
        draw = Draw(**{**case["draw"], "m_per_p": {int(k): v for k, v in case["draw"]["m_per_p"].items()}})
        yield SavedCase(case["model"], case["p"], draw, costs_from_dict(case["costs"]),
                        {n: Trace.from_dict(t) for n, t in case["traces"].items()},
                        {n: [Trace.from_dict(t) for t in ts] for n, ts in case.get("calibration_steps", {}).items()})


def predict(schedule, costs: CostModel) -> Trace:
    """What `validate` predicts for a run of `schedule` (receives posted as the runs posted them)."""
    from pipesched.executor.validation import predict as predict_run

    return predict_run(schedule, replace(costs, recv_lookahead=LOOKAHEAD))


def calibration_runs(schedules: dict, traces: dict[str, Trace], steps: dict[str, list[Trace]] | None
                     ) -> tuple[list, list]:
    """The runs `validate` reads costs from, as (schedule, trace) per measured step: those
    of 1F1B and ZB-H1, and those at the other split (ZB-V)."""
    def of(names):
        return [(schedules[n], t) for n in names if n in traces for t in (steps or {}).get(n, [traces[n]])]

    return of(CALIBRATION_RUNS), of((OTHER_SPLIT_RUN,))


def default_costs(solo: CostModel, runs: list, other: list) -> CostModel:
    """The costs `validate` predicts with on CPUs (`--op-times runs`): both splits, host
    time fitted to the runs, dedicated work where ranks share cores, the step residual."""
    return costs_from_runs(solo, runs + other, host_time=True, sharing=solo.host)


def evaluate(index: int, p: int, draw: Draw, solo: CostModel, traces: dict[str, Trace],
             steps: dict[str, list[Trace]] | None = None) -> list[dict]:
    """Every schedule's errors under each estimator, and its replay errors. `steps`: every
    measured step of the calibration runs, pooled as `validate` pools them (runs saved
    without them use each run's median step)."""
    from pipesched.executor.validation import too_short

    m = draw.m_per_p[p]
    short = too_short(solo)
    schedules = {name: build(name, p, m) for name in traces}
    runs, other = calibration_runs(schedules, traces, steps)
    complete = all(n in traces for n in CALIBRATION_RUNS)
    from_runs = default_costs(solo, runs, other) if complete else None
    auto = solo if solo.host is not None and solo.host.gpu else from_runs  # what --op-times auto picks
    rows = []
    for name, trace in traces.items():
        schedule = schedules[name]
        measured = compute_metrics(trace).makespan
        steps_made = trace.meta.get("makespans") or [measured]
        row = {"model": index, "p": p, "m": m, "schedule": name, "measured": measured,
               "in_calibration": name in CALIBRATION_RUNS + (OTHER_SPLIT_RUN,), "short_ops": short,
               "makespan_spread": relative_iqr(steps_made), "halves": step_halves(steps_made)}
        for label, costs in (("solo", solo), ("run", from_runs), ("auto", auto)):
            if costs is None:
                row[label] = row[f"{label}_error"] = float("nan")
                continue
            predicted = compute_metrics(predict(schedule, costs)).makespan
            row[label], row[f"{label}_error"] = predicted, (predicted - measured) / measured
        for key, host in (("replay_error", "run"), ("replay_calibrated_error", "costs")):
            replayed = replay(schedule, trace, replace(solo, recv_lookahead=LOOKAHEAD), host=host)
            row[key] = compare(replayed, trace).makespan_rel_error
        rows.append(row)
    return rows


ESTIMATORS = (("solo", "op times from solo profiles"), ("run", "from 1F1B, ZB-H1 and ZB-V runs"),
              ("auto", "the default (runs on CPUs)"))


def ranking_hits(rows: list[dict], label: str) -> list[bool]:
    """Per (model, p): does the schedule predicted fastest measure within the tolerance
    of the measured fastest?"""
    hits = []
    for key in sorted({(r["model"], r["p"]) for r in rows}):
        group = [r for r in rows if (r["model"], r["p"]) == key and np.isfinite(r[label])]
        if len(group) < 2:
            continue
        best = min(r["measured"] for r in group)
        chosen = min(group, key=lambda r: r[label])
        hits.append(chosen["measured"] <= best * (1 + RANKING_TOLERANCE))
    return hits


def self_agreement(rows: list[dict], label: str) -> tuple[list[float], int, int, int]:
    """The measurement against itself: |even / odd - 1| per run; over each (model, p) and
    both ways round, how often the fastest by one half and `label`'s predicted fastest
    are within the tolerance of the fastest by the other half, and of how many."""
    gaps, by_half, by_prediction, judged = [], 0, 0, 0
    for key in sorted({(r["model"], r["p"]) for r in rows}):
        group = [r for r in rows if (r["model"], r["p"]) == key and r["halves"] and np.isfinite(r[label])]
        gaps += [abs(r["halves"][0] / r["halves"][1] - 1) for r in group]
        if len(group) < 2:
            continue
        chosen = min(group, key=lambda r: r[label])
        for pick, judge in ((0, 1), (1, 0)):
            best = min(r["halves"][judge] for r in group)
            by_half += min(group, key=lambda r: r["halves"][pick])["halves"][judge] <= best * (1 + RANKING_TOLERANCE)
            by_prediction += chosen["halves"][judge] <= best * (1 + RANKING_TOLERANCE)
            judged += 1
    return gaps, by_half, by_prediction, judged


def stats(values: list[float]) -> str:
    a = [abs(v) for v in values if np.isfinite(v)]
    return f"median {100 * statistics.median(a):5.2f} %, max {100 * max(a):6.2f} %" if a else "no cases"


def _median_max(values: list[float]) -> dict:
    a = [abs(v) for v in values if np.isfinite(v)]
    return {"median": statistics.median(a), "max": max(a)} if a else {"median": None, "max": None}


def summary(rows: list[dict]) -> dict:
    """Per p, what `report` prints, as numbers (fractions, not percent): each estimator's
    |error| over all runs and over the schedules not used to calibrate, its ranking hits,
    and the replays' |error|."""
    out = {}
    for p in sorted({r["p"] for r in rows}):
        here = [r for r in rows if r["p"] == p]
        other = [r for r in here if not r["in_calibration"]]
        entry = {"runs": len(here), "models": len({r["model"] for r in here})}
        for label, _ in ESTIMATORS:
            hits = ranking_hits(here, label)
            entry[label] = {"all": _median_max([r[f"{label}_error"] for r in here]),
                            "other": _median_max([r[f"{label}_error"] for r in other]),
                            "fastest_right": sum(hits), "judged": len(hits)}
        for key in ("replay_error", "replay_calibrated_error"):
            entry[key] = _median_max([r[key] for r in here])
        out[str(p)] = entry
    return out


def report(rows: list[dict]) -> None:
    print()
    for p in sorted({r["p"] for r in rows}):
        here = [r for r in rows if r["p"] == p]
        out = [r for r in here if not r["in_calibration"]]
        print(f"p={p} ({len(here)} runs of {len({r['model'] for r in here})} models):")
        for label, what in ESTIMATORS:
            hits = ranking_hits(here, label)
            print(f"  {what:<36} all {stats([r[f'{label}_error'] for r in here])}; "
                  f"other schedules {stats([r[f'{label}_error'] for r in out])}; "
                  f"fastest right {sum(hits)}/{len(hits)}")
        long_ops = [r for r in here if not r["short_ops"]]
        hits = ranking_hits(long_ops, "auto")
        print(f"  {'the default where validate would not warn':<36} {stats([r['auto_error'] for r in long_ops])} "
              f"({len(long_ops)} runs of {len({r['model'] for r in long_ops})} models); fastest right {sum(hits)}/{len(hits)}")
        print(f"  {'replay (host time fitted to the run)':<36} all {stats([r['replay_error'] for r in here])}")
        print(f"  {'replay (host time as calibrated)':<36} all {stats([r['replay_calibrated_error'] for r in here])}")
        print(f"  {'measured steps, IQR over median':<36} median {100 * statistics.median(r['makespan_spread'] for r in here):.2f} %")
        gaps, by_half, by_prediction, judged = self_agreement(here, "auto")
        if gaps:
            print(f"  {'even against odd steps':<36} |even/odd - 1| {stats(gaps)}, over 6 %: {sum(g > 0.06 for g in gaps)}, "
                  f"over 8 %: {sum(g > 0.08 for g in gaps)} of {len(gaps)}; fastest by one half right by the other "
                  f"{by_half}/{judged}, the default's fastest {by_prediction}/{judged}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", type=int, default=8, help="how many models to draw")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--draw-ranks", metavar="P,P,...",
                    help="draw the models as for these p (default: --ranks), so a launch of --ranks 8 alone "
                         "runs the same models as one of --ranks 2,4,8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of measured steps per run, at least")
    ap.add_argument("--repeats", type=int, default=15, help="calibration repetitions")
    ap.add_argument("--save-runs", metavar="RUNS.npz", help="write every launch's calibration and traces "
                    "(benchmarks/saved_runs.py; .npz is compact)")
    ap.add_argument("--from-runs", metavar="RUNS.npz", help="run nothing: evaluate saved runs again")
    ap.add_argument("--json", metavar="SUMMARY.json", help="also write the per-p summary as JSON")
    args = ap.parse_args()
    started = time.perf_counter()
    rows: list[dict] = []
    if args.from_runs:
        doc = saved_runs.read(args.from_runs)
        print(doc["machine"])
        print(f"seed {doc['seed']}, {len(doc['cases'])} launches")
        for case in saved_cases(doc):
            rows += evaluate(case.model, case.p, case.draw, case.costs, case.traces, case.steps)
        _print_rows(rows)
        report(rows)
        _write_summary(args.json, rows)
        return 0

    import torch

    from pipesched.executor.calibrate import CalibrationOptions
    from pipesched.executor.comm import HostOutOfMemory
    from pipesched.executor.job import RunOptions
    from pipesched.executor.launch import launch_local

    ranks = [int(x) for x in args.ranks.split(",")]
    machine = (f"machine: {platform.machine()}, {os.cpu_count()} cores ({cpu_name()}), torch {torch.__version__}, "
               f"gloo on CPU, load average at start {os.getloadavg()[0]:.2f}")
    print(machine)
    draw_ranks = [int(x) for x in args.draw_ranks.split(",")] if args.draw_ranks else ranks
    if not set(ranks) <= set(draw_ranks):
        ap.error("--draw-ranks must hold every p in --ranks")
    draws = draw_models(args.seed, args.models, draw_ranks)
    for i, d in enumerate(draws):
        print(f"model {i}: {d.describe()}", flush=True)
    calibration = CalibrationOptions(repeats=args.repeats, timeout=600)
    options = RunOptions(steps=args.steps, warmup=args.warmup, min_time=args.min_time, timeout=600, check=False,
                         lookahead=LOOKAHEAD)
    saved = []
    for p in ranks:
        for i, draw in enumerate(draws):
            t0 = time.perf_counter()
            try:
                costs, results, skipped = launch_local(measure_model, (p, draw, calibration, options), p, timeout=600)
            except HostOutOfMemory as exc:  # every schedule's model at once can outgrow the host: say so, go on
                print(f"  (model {i}, p={p}: not measured, {exc})", flush=True)
                continue
            traces = {n: r.trace for n, r in results.items()}
            steps = {n: results[n].step_traces for n in CALIBRATION_RUNS + (OTHER_SPLIT_RUN,) if n in results}
            new = evaluate(i, p, draw, costs, traces, steps)
            _print_rows(new, header=not rows)
            load = os.getloadavg()[0]
            print(f"  (model {i}, p={p}: {time.perf_counter() - t0:.0f} s, load average {load:.2f}; "
                  f"skipped {', '.join(skipped) or 'none'})", flush=True)
            rows += new
            saved.append({"model": i, "p": p, "draw": asdict(draw), "costs": to_dict(costs), "load": load,
                          "traces": {n: t.to_dict() for n, t in traces.items()},
                          "calibration_steps": {n: [t.to_dict() for t in ts] for n, ts in steps.items()}})
            if args.save_runs:  # after every launch, so a run cut short keeps what it measured
                saved_runs.write(args.save_runs, {"machine": machine, "seed": args.seed, "cases": saved})
    report(rows)
    _write_summary(args.json, rows)
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


def _write_summary(path: str | None, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps(summary(rows), indent=1) + "\n")


def _print_rows(rows: list[dict], header: bool = True) -> None:
    if header:
        print(f"{'model':>5} {'p':>2} {'m':>3} {'schedule':<17} {'measured':>10} {'solo':>8} {'runs':>8} "
              f"{'replay':>8} {'replay-c':>8} {'spread':>7}")
    for r in rows:
        mark = "*" if r["in_calibration"] else " "
        print(f"{r['model']:>5} {r['p']:>2} {r['m']:>3} {r['schedule'] + mark:<17} {1e3 * r['measured']:>8.1f}ms "
              + " ".join(_signed_percent(r[k]) for k in ("solo_error", "run_error", "replay_error",
                                                         "replay_calibrated_error")) + " "
              f"{100 * r['makespan_spread']:>6.2f}%", flush=True)


def _signed_percent(x: float) -> str:
    """x as a signed percentage to 0.01 %; a value that rounds to zero prints +0.00 % whatever
    its sign, which floating-point sums can flip between machines."""
    return f"{round(100 * x, 2) + 0.0:>+7.2f}%"


if __name__ == "__main__":
    sys.exit(main())
