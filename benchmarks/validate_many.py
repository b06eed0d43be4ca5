"""Which schedule wins, as a user asks it: `pipesched validate A,B,...` (every built-in
schedule from one calibration, their runs in turn) end to end on models drawn from a
seeded generator (`random_models.py`, as `accuracy_random.py` draws them, so a fresh seed is a fresh
set of models nobody tuned for).

Printed per model and p: the command's wall time, each schedule's makespan error, the
predicted and measured fastest and whether the predicted pick measured within 2 % of the
fastest, and the largest even-against-odd-steps difference of its runs (the measurement
against itself). Then per p: median and max |error| over the schedules not used to
calibrate, over all, and over the calibration's own schedules (1F1B, ZB-H1, ZB-V: each is
validated in a run of its own beside the calibration's run of it, so their error is how
well two runs of one schedule in one launch agree, the floor under every other error),
the ranking hits, how much slower the predicted pick measured than the measured fastest
(median and worst: the loss a user who trusts the pick pays), how often the command
said its pick was not settled and the worst loss of the picks it called settled, and the
loss of a user who follows the command: its pick where settled, else the fastest
measured of the schedules it said to measure.

With --launches N every model is launched N times, the same command each time (launches
of one model in turn, so they are minutes apart), and the summary adds how far a
schedule's error moved from one launch to the next and in how many models the measured
fastest stayed the same: what the machine repeats.

With --step-barrier none each command also runs every schedule's steps back to back and
compares the period (`validate --step-barrier none`): the period's error is printed beside
the makespan's, and the ranking (hits, losses) is by period.

    python benchmarks/validate_many.py --seed 2037 --models 6 [--ranks 2,4] [--out DIR] [--step-barrier none]
                                       [--launches 2] [--steps 40]

With --steps N every run (the schedules' and the calibration's, which take as many steps
as the runs beside them) measures N steps: a step here spreads 11-15 % (IQR over median)
whatever its length, so the median of ten is known to a few percent, and the errors above
are partly the measurement's own.

With --rerank DIR nothing runs: the folders an earlier run kept (its --out) are ranked
again with today's `validate` ranking and summarized as above (without wall times).

    python benchmarks/validate_many.py --rerank DIR [DIR ...]
"""
from __future__ import annotations

import argparse
import os
import re
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
    ap.add_argument("--launches", type=int, default=1, help="launch each model this many times (what repeats)")
    ap.add_argument("--steps", type=int, help="measured steps of every run (validate's --steps; default its own): "
                                              "more steps, a median nearer the run's own")
    ap.add_argument("--rerank", nargs="+", type=Path, metavar="DIR",
                    help="run nothing: rank the folders an earlier run kept again and summarize them")
    args = ap.parse_args()
    if args.rerank:
        return rerank(args.rerank)
    if not 1 <= args.launches <= 10:
        ap.error("--launches must be 1..10")
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be at least 1")
    periods = args.step_barrier == "none"
    out = args.out or Path(tempfile.mkdtemp(prefix="validate-many-"))
    ranks = [int(x) for x in args.ranks.split(",")]
    draws = draw_models(args.seed, args.models, ranks)
    print(f"seed {args.seed}, {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.2f}, "
          f"{args.steps or 'the command default'} measured steps a run")
    for p in ranks:
        docs, walls = {}, []
        for i, draw in enumerate(draws):
            for k in range(args.launches):
                folder = out / (f"p{p}-model{i}" + (f"-launch{k}" if args.launches > 1 else ""))
                cmd = ["pipesched", "validate", ",".join(SCHEDULES), "-p", str(p), "-m", str(draw.m_per_p[p]),
                       *model_flags(draw), "--json", "--out", str(folder), "--step-barrier", args.step_barrier]
                cmd += ["--steps", str(args.steps)] if args.steps else []
                label = f"p={p} model {i}" + (f" launch {k}" if args.launches > 1 else "")
                doc, wall = run_json(cmd, label)
                if doc is None:
                    continue
                docs[(i, k)] = doc
                walls.append(wall)
                print_launch(label, draw, p, doc, wall, periods)
        if docs:
            summarize(p, docs, walls, periods, out)
    return 0


KEPT = re.compile(r"p(\d+)-model(\d+)(?:-launch(\d+))?")


def kept_doc(folder: Path) -> dict:
    """What `validate A,B,... --json` reported for a kept folder (one subfolder per
    schedule with predicted.json, measured.json and costs.json), ranked with today's
    `ranking_of`: the fields the summary reads."""
    from pipesched.commands.validate_many import ranking_of
    from pipesched.executor.solo_calibration import oversubscribed
    from pipesched.executor.validation import calibration_run_apart, measured_makespan
    from pipesched.simulator.cost_file import load
    from pipesched.simulator.metrics import compute_metrics
    from pipesched.simulator.run_costs import halves_apart
    from pipesched.simulator.trace import Trace

    summaries, shared = [], False
    for run in sorted(d for d in folder.iterdir() if (d / "measured.json").is_file()):
        measured, costs = Trace.load(run / "measured.json"), load(run / "costs.json")
        held = measured_makespan(measured, costs.data_parallel.degree)
        predicted = compute_metrics(Trace.load(run / "predicted.json")).makespan
        shared = oversubscribed(costs.host, measured.ranks)
        summaries.append({"schedule": run.name, "measured": {"makespan": held}, "predicted": {"makespan": predicted},
                          "makespan_rel_error": (predicted - held) / held,
                          "measured_halves_apart": halves_apart(measured.meta.get("makespans") or []),
                          "calibration_run_apart": calibration_run_apart(costs, measured)})
    return {"schedules": summaries, "ranking": ranking_of(summaries, shared)}


def rerank(roots: list[Path]) -> int:
    """--rerank: every kept folder under `roots`, summarized per p (module docstring)."""
    by_p: dict[int, dict[tuple[int, int], dict]] = {}
    models: dict[tuple[Path, int], int] = {}  # (root, model) -> one number over every root
    for root in roots:
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            name = KEPT.fullmatch(folder.name)
            if name:
                p, model = int(name[1]), models.setdefault((root, int(name[2])), len(models))
                by_p.setdefault(p, {})[(model, int(name[3] or 0))] = kept_doc(folder)
    if not by_p:
        print("validate_many: no kept folders (pP-modelI[-launchK]) under " + ", ".join(map(str, roots)),
              file=sys.stderr)
        return 2
    for p, docs in sorted(by_p.items()):
        summarize(p, docs, [], False, roots[0] if len(roots) == 1 else Path(", ".join(map(str, roots))))
    return 0


def print_launch(label: str, draw, p: int, doc: dict, wall: float, periods: bool) -> None:
    """One line: the model, each schedule's error, the ranking and the runs' halves."""
    ranking = doc["ranking"]
    hit = ranking["pick_over_fastest"] <= RANKING_TOLERANCE
    halves = max(s["measured_halves_apart"] or 0.0 for s in doc["schedules"])
    print(f"{label} ({draw.kind} hidden {draw.hidden}, {draw.depth} blocks a rank, microbatch "
          f"{draw.microbatch_size}, m {draw.m_per_p[p]}): {wall:.0f} s; errors "
          + " ".join(f"{s['schedule']} {100 * s['makespan_rel_error']:+.1f}%"
                     + (f" (period {100 * s['period']['rel_error']:+.1f}%)" if periods else "")
                     for s in doc["schedules"])
          + f"; fastest predicted {ranking['predicted_fastest']}, measured {ranking['measured_fastest']} "
          f"(pick {100 * ranking['pick_over_fastest']:+.1f} %: {'right' if hit else 'WRONG'}{settled_note(ranking)}); "
          f"halves apart up to {100 * halves:.1f} %", flush=True)


def advised_loss(doc: dict) -> tuple[bool, float]:
    """(whether the command called its pick settled, how much slower than the measured
    fastest the schedule a user who follows it ends with measured): the pick where
    settled, else the fastest measured of the schedules it said to measure."""
    ranking = doc["ranking"]
    sure = ranking.get("confidence")
    if not sure or sure["settled"]:
        return True, ranking["pick_over_fastest"]
    by = ranking.get("by", "makespan")
    measured = {s["schedule"]: s["period"]["measured"] if by == "period" else s["measured"]["makespan"]
                for s in doc["schedules"]}
    chosen = min(sure["to_measure"], key=measured.__getitem__)
    return False, measured[chosen] / measured[ranking["measured_fastest"]] - 1


def settled_note(ranking: dict) -> str:
    """', not settled' where the command said so, with the launch's floor where it set the error."""
    from pipesched.commands.validate_many import floor_source

    sure = ranking.get("confidence")
    if not sure or sure["settled"]:
        return ""
    return ", not settled" + (f" ({floor_source(ranking)} {100 * sure['floor']:.1f} % apart)"
                              if sure["by_floor"] else "")


def summarize(p: int, docs: dict[tuple[int, int], dict], walls: list[float], periods: bool, out: Path) -> None:
    """The per-p summary over every launch (module docstring)."""
    calibrating = set(CALIBRATION_RUNS) | {OTHER_SPLIT_RUN}
    rows = [s for doc in docs.values() for s in doc["schedules"]]
    errors = [abs(s["makespan_rel_error"]) for s in rows]
    other = [abs(s["makespan_rel_error"]) for s in rows if s["schedule"] not in calibrating]
    again = [abs(s["makespan_rel_error"]) for s in rows if s["schedule"] in calibrating]
    losses = [doc["ranking"]["pick_over_fastest"] for doc in docs.values()]
    hits = sum(loss <= RANKING_TOLERANCE for loss in losses)
    advised = [advised_loss(doc) for doc in docs.values()]
    settled = [loss for sure, loss in advised if sure]
    unsettled = len(advised) - len(settled)
    followed = [loss for _, loss in advised]
    named = [len(doc["ranking"]["confidence"]["to_measure"]) for doc, (sure, _) in zip(docs.values(), advised)
             if not sure]

    def median_max(values: list[float]) -> str:
        return f"median {100 * statistics.median(values):.2f} %, max {100 * max(values):.2f} %" if values else "none"

    line = (f"p={p}: other schedules {median_max(other)}; all median {100 * statistics.median(errors):.2f} %; "
            f"the calibration's own schedules run again beside it {median_max(again)}; "
            f"fastest right {hits}/{len(losses)}; "
            f"the pick measured over the fastest: median {100 * statistics.median(losses):.2f} %, worst "
            f"{100 * max(losses):.2f} %; picks the command called not settled {unsettled}/{len(losses)} "
            f"(the settled ones' loss worst {100 * max(settled, default=0.0):.2f} %; the others named a median "
            f"{statistics.median(named) if named else 0:g} of {len(SCHEDULES)} to measure); "
            f"following the command "
            f"(its pick where settled, else the fastest measured of those it named): loss median "
            f"{100 * statistics.median(followed):.2f} %, worst {100 * max(followed):.2f} %; "
            + (f"wall median {statistics.median(walls):.0f} s " if walls else "")
            + f"(runs kept in {out})")
    if periods:
        period_errors = [abs(s["period"]["rel_error"]) for s in rows]
        line += f"; period error {median_max(period_errors)} (ranked by period)"
    print(line)
    moved, same_fastest, models = [], 0, 0
    for i in sorted({i for i, _ in docs}):
        launches = [docs[key] for key in sorted(docs) if key[0] == i]
        if len(launches) < 2:
            continue
        models += 1
        same_fastest += len({d["ranking"]["measured_fastest"] for d in launches}) == 1
        for a, b in zip(launches, launches[1:]):
            first = {s["schedule"]: s["makespan_rel_error"] for s in a["schedules"]}
            moved += [abs(s["makespan_rel_error"] - first[s["schedule"]]) for s in b["schedules"]
                      if s["schedule"] in first]
    if moved:
        print(f"p={p}, the same models launched again: a schedule's error moved by median "
              f"{100 * statistics.median(moved):.2f} points, max {100 * max(moved):.2f} ({len(moved)} pairs); "
              f"the measured fastest the same in every launch in {same_fastest} of {models} models")


if __name__ == "__main__":
    sys.exit(main())
