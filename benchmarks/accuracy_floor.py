"""What limits prediction accuracy on this host, read from saved `accuracy_random.py` runs.

Two floors beside the default prediction (`validate --op-times runs`), per p:

1. The measurement against itself. Each run's even and odd steps, taken in turn with the
   other schedules' steps, are two measurements of the same thing: how far apart their
   typical steps are, and how often the fastest schedule by one half measures within 2 %
   of the fastest by the other. A target tighter than this cannot be checked here.
2. A predictor that knows each run's own op times. Every run is predicted from the op
   means of its own measured steps (`simulator.run_costs.costs_from_runs` on that run
   alone, at its own split, host time fitted, no step residual), then scaled by the step
   residual of the calibration runs (1F1B and ZB-H1), as the default scales it. What is
   left is the part of the error that op means cannot give: which ops were slow, and how
   that lengthened a step of this schedule more or less than one of 1F1B. Saved runs keep
   every step only of the calibration runs; the other schedules' op means come from
   their typical step alone, the step they are judged against, so this floor is if
   anything too low.

3. The measurement in another launch, where files repeat a seed (the same models, launched
   again): how far a schedule's typical step moves from one launch to the next, alone and
   over 1F1B's in the same launch (what a ranking rests on); how often the fastest by one
   launch measures within 2 % of the fastest by the other; and the default prediction of
   one launch against the other's measurement, for the schedules calibration did not run
   (calibrate today, run tomorrow).

The default's error minus the second floor is what better op means could still win; the
second floor minus the first is what a mean-op simulator cannot.

    python benchmarks/accuracy_floor.py benchmarks/results/accuracy_random_seed2073_runs.json.gz [...]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_random import (CALIBRATION_RUNS, OTHER_SPLIT_RUN, evaluate, predict, ranking_hits,  # noqa: E402
                             saved_cases, self_agreement)

from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.costs import CostModel  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.run_costs import costs_from_runs, typical_step  # noqa: E402
from pipesched.simulator.trace import Trace  # noqa: E402


def own_means_errors(p: int, m: int, solo: CostModel, traces: dict[str, Trace],
                     steps: dict[str, list[Trace]]) -> dict[str, float]:
    """Schedule -> relative error of the prediction from its own run's op means, scaled by
    the calibration runs' step residual (module docstring); {} without both calibration runs."""
    at_two = replace(solo, model_stages=tuple(solo.model_stage_costs(p, 2 * p)))
    at_two = replace(at_two, stages=at_two.model_stages[:1])
    if not all(n in traces for n in CALIBRATION_RUNS):
        return {}
    predicted = {}
    for name, trace in traces.items():
        schedule = build(name, p, m)
        base = solo if schedule.num_model_stages == p else at_two
        own = [(schedule, t) for t in steps.get(name) or [trace]]
        costs = costs_from_runs(base, own, host_time=True, sharing=solo.host, residual=False)
        predicted[name] = compute_metrics(predict(schedule, costs)).makespan
    # the calibration runs' step residual, each over all its measured steps, as the default reads it
    measured = {n: typical_step([compute_metrics(t).makespan for t in steps.get(n) or [traces[n]]])
                for n in CALIBRATION_RUNS}
    residual = float(np.exp(np.mean([np.log(measured[n] / predicted[n]) for n in CALIBRATION_RUNS])))
    return {name: predicted[name] * residual / compute_metrics(traces[name]).makespan - 1.0 for name in traces}


def spread(values: list[float]) -> str:
    a = np.abs(np.asarray(values, dtype=float))
    return (f"median {100 * statistics.median(a):5.2f} %, 90th percentile {100 * np.percentile(a, 90):5.2f} %, "
            f"max {100 * a.max():6.2f} % ({len(a)})") if len(a) else "no cases"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUNS.json.gz", help="files written by accuracy_random.py --save-runs")
    args = ap.parse_args()
    missing = [path for path in args.runs if not Path(path).is_file()]
    if missing:
        ap.error(f"no such file: {missing[0]}")
    rows: list[dict] = []
    for path in args.runs:
        doc = json.loads(gzip.decompress(Path(path).read_bytes()))
        for case in saved_cases(doc):
            model = (doc["seed"], case.model, path)  # models of different seeds share indices
            own = own_means_errors(case.p, case.draw.m_per_p[case.p], case.costs, case.traces, case.steps)
            for row in evaluate(case.model, case.p, case.draw, case.costs, case.traces, case.steps):
                rows.append({**row, "model": model, "own_error": own.get(row["schedule"], float("nan"))})
    models, launched = len({r["model"][:2] for r in rows}), len({r["model"] for r in rows})
    repeats = f" ({launched} counting each repeat)" if launched > models else ""
    print(f"{len(args.runs)} files, {models} models{repeats}")
    others = (*CALIBRATION_RUNS, OTHER_SPLIT_RUN)
    for p in sorted({r["p"] for r in rows}):
        here = [r for r in rows if r["p"] == p]
        out = [r for r in here if r["schedule"] not in others]
        gaps, by_half, _, judged = self_agreement(here, "auto")
        print(f"p={p} ({len(here)} runs of {len({r['model'] for r in here})} models):")
        print(f"  {'even against odd steps, |even/odd - 1|':<44} {spread(gaps)}")
        print(f"  {'fastest by one half within 2 % by the other':<44} {by_half} of {judged}")
        for label, what in (("own", "from each run's own op means"), ("auto", "the default prediction")):
            errors = [r[f"{label}_error"] for r in out if np.isfinite(r[f"{label}_error"])]
            print(f"  {what + ', other schedules':<44} {spread(errors)}")
        hits = ranking_hits(here, "auto")
        what = "the default's fastest within 2 % of fastest"
        print(f"  {what:<44} {sum(hits)} of {len(hits)}")
        repeated_launches(here)
    return 0


def repeated_launches(rows: list[dict]) -> None:
    """Floor 3 (module docstring) over every pair of launches of the same seed's model."""
    launches: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in rows:
        seed, index, path = r["model"]
        launches.setdefault((seed, index), {}).setdefault(path, {})[r["schedule"]] = r
    moved, against_1f1b, cross, hits, judged = [], [], [], 0, 0
    for runs in launches.values():
        files = sorted(runs)
        for a in files:
            for b in files:
                if a == b or not {"1f1b"} <= runs[a].keys() & runs[b].keys():
                    continue
                common = sorted(runs[a].keys() & runs[b].keys())
                ra, rb = runs[a], runs[b]
                hits += rb[min(common, key=lambda n: ra[n]["measured"])]["measured"] <= \
                    min(rb[n]["measured"] for n in common) * 1.02
                judged += 1
                cross += [ra[n]["auto"] / rb[n]["measured"] - 1 for n in common
                          if np.isfinite(ra[n]["auto"]) and not ra[n]["in_calibration"]]
                if a < b:
                    moved += [ra[n]["measured"] / rb[n]["measured"] - 1 for n in common]
                    against_1f1b += [(ra[n]["measured"] / ra["1f1b"]["measured"])
                                     / (rb[n]["measured"] / rb["1f1b"]["measured"]) - 1 for n in common if n != "1f1b"]
    if not judged:
        return
    for what, values in (("another launch: each step moved", spread(moved)),
                         ("... over 1F1B's in the same launch", spread(against_1f1b)),
                         ("fastest by one launch within 2 % by another", f"{hits} of {judged}"),
                         ("the default of one launch, other schedules", spread(cross))):
        print(f"  {what:<44} {values}")


if __name__ == "__main__":
    sys.exit(main())
