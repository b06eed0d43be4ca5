"""Which schedule wins, as a user asks it: `pipesched validate A,B,...` (every built-in
schedule from one calibration, their runs in turn) end to end on models drawn from a
seeded generator (`random_models.py`, as `accuracy_random.py` draws them, so a fresh seed is a fresh
set of models nobody tuned for).

Printed per model and p: the command's wall time, each schedule's makespan error, the
predicted and measured fastest and whether the predicted pick measured within 2 % of the
fastest, and the largest even-against-odd-steps difference of its runs (the measurement
against itself). Then per p: median and max |error| over the schedules not used to
calibrate, over all, the ranking hits, how much slower the predicted pick measured than the
measured fastest (median and worst: the loss a user who trusts the pick pays) and how often
the command said its pick was not settled.

With --step-barrier none each command also runs every schedule's steps back to back and
compares the period (`validate --step-barrier none`): the period's error is printed beside
the makespan's, and the ranking (hits, losses) is by period.

    python benchmarks/validate_many.py --seed 2037 --models 6 [--ranks 2,4] [--out DIR] [--step-barrier none]
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
from random_models import CALIBRATION_RUNS, OTHER_SPLIT_RUN, RANKING_TOLERANCE, SCHEDULES, draw_models  # noqa: E402


def model_flags(draw) -> list[str]:
    """The CLI flags of a drawn model, split for v = 1 (the first schedule, GPipe)."""
    flags = ["--model", draw.kind, "--hidden", str(draw.hidden), "--layers-per-stage", str(draw.depth),
             "--microbatch-size", str(draw.microbatch_size)]
    return flags + (["--seq", str(draw.seq)] if draw.kind == "transformer" else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--out", type=Path, help="keep each command's folder here")
    ap.add_argument("--step-barrier", choices=("all", "none"), default="all",
                    help="none: also compare each schedule's period of steps back to back, and rank by it")
    args = ap.parse_args()
    periods = args.step_barrier == "none"
    out = args.out or Path(tempfile.mkdtemp(prefix="validate-many-"))
    ranks = [int(x) for x in args.ranks.split(",")]
    draws = draw_models(args.seed, args.models, ranks)
    calibrating = set(CALIBRATION_RUNS) | {OTHER_SPLIT_RUN}
    print(f"seed {args.seed}, {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.2f}")
    for p in ranks:
        errors, other, hits, walls, losses, unsettled, period_errors = [], [], [], [], [], 0, []
        for i, draw in enumerate(draws):
            folder = out / f"p{p}-model{i}"
            cmd = ["pipesched", "validate", ",".join(SCHEDULES), "-p", str(p), "-m", str(draw.m_per_p[p]),
                   *model_flags(draw), "--json", "--out", str(folder), "--step-barrier", args.step_barrier]
            doc, wall = run_json(cmd, f"p={p} model {i}")
            if doc is None:
                continue
            ranking = doc["ranking"]
            hit = ranking["pick_over_fastest"] <= RANKING_TOLERANCE
            hits.append(hit)
            walls.append(wall)
            losses.append(ranking["pick_over_fastest"])
            sure = ranking.get("confidence")
            unsettled += bool(sure and not sure["settled"])
            errors += [abs(s["makespan_rel_error"]) for s in doc["schedules"]]
            other += [abs(s["makespan_rel_error"]) for s in doc["schedules"] if s["schedule"] not in calibrating]
            halves = max(s["measured_halves_apart"] or 0.0 for s in doc["schedules"])
            if periods:
                period_errors += [abs(s["period"]["rel_error"]) for s in doc["schedules"]]
            print(f"p={p} model {i} ({draw.kind} hidden {draw.hidden}, {draw.depth} blocks a rank, microbatch "
                  f"{draw.microbatch_size}, m {draw.m_per_p[p]}): {wall:.0f} s; errors "
                  + " ".join(f"{s['schedule']} {100 * s['makespan_rel_error']:+.1f}%"
                             + (f" (period {100 * s['period']['rel_error']:+.1f}%)" if periods else "")
                             for s in doc["schedules"])
                  + f"; fastest predicted {ranking['predicted_fastest']}, measured {ranking['measured_fastest']} "
                  f"(pick {100 * ranking['pick_over_fastest']:+.1f} %: {'right' if hit else 'WRONG'}); "
                  f"halves apart up to {100 * halves:.1f} %", flush=True)
        if errors:
            print(f"p={p}: other schedules median {100 * statistics.median(other):.2f} %, max {100 * max(other):.2f} %; "
                  f"all median {100 * statistics.median(errors):.2f} %; fastest right {sum(hits)}/{len(hits)}; "
                  f"the pick measured over the fastest: median {100 * statistics.median(losses):.2f} %, worst "
                  f"{100 * max(losses):.2f} %; picks the command called not settled {unsettled}/{len(losses)}; "
                  f"wall median {statistics.median(walls):.0f} s (runs kept in {out})"
                  + (f"; period error median {100 * statistics.median(period_errors):.2f} %, max "
                     f"{100 * max(period_errors):.2f} % (ranked by period)" if period_errors else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
