"""Which ops run longer or shorter than predicted, by what ran before them on the core.

Reads the folders `validate A,B,... --out DIR` writes (one `NAME/predicted.json` and
`NAME/measured.json` per schedule; `validate_many.py --out` keeps one such folder per
model) and holds every measured op against the same op in the prediction (same rank,
op, microbatch and virtual stage). Each op is put in one context by the task before it
on its rank, in the measured order:

- `first`: the step's first op on the rank;
- `repeat`: the same op kind of the same stage (an F right after an F of that stage);
- `same`: another op kind of the same stage (an F after that stage's B or BW);
- `switch`: an op of another stage (the chunks of v = 2 schedules, DualPipe's replicas).

Printed: per schedule and op kind, the median measured / predicted time in each context
(with the number of ops), pooled over every model found; the same pooled over every
schedule by the op's place in a run of its kind and stage (the 1st: after another kind
or stage, the 2nd: right after one of its kind, ...); then each schedule's measured op
time over predicted against its makespan error, per model. A context whose ratio
differs from the others' is a property of the op the cost model does not hold.

With --replay, also per schedule the median makespan error of the prediction and of the
run replayed (`simulator.replay`) with each task's own measured time and with the median
per op kind and model stage on each rank: where the replay by kind is right and the
prediction is not, the op times the calibration gave that schedule are what misses, not
how the simulator combines them.

    python benchmarks/op_context.py DIR [DIR ...] [--replay]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pipesched.schedules.registry import build
from pipesched.simulator.cost_file import load as load_costs
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.replay import replay
from pipesched.simulator.trace import COMPUTE, SPAN_OPS, Trace, TraceError

CONTEXTS = ("first", "repeat", "same", "switch")
PLACES = ("1st", "2nd", "3rd", "4th", "5th+")  # an op's place in a run of its kind and stage


def run_folders(roots: list[Path]) -> list[Path]:
    """Every folder under `roots` (themselves included) that holds a predicted and a
    measured trace."""
    found = []
    for root in roots:
        for measured in sorted(root.rglob("measured.json")):
            if (measured.parent / "predicted.json").is_file():
                found.append(measured.parent)
    return found


def op_ratios(predicted: Trace, measured: Trace) -> list[tuple[str, str, int, float]]:
    """(op kind, context, place in its run, measured / predicted seconds) for each
    measured compute op; its place: how many ops of its kind and stage ran right before
    it on its rank (0: it follows another kind or stage, or starts the step)."""
    want = {}
    for s in predicted.spans(COMPUTE):
        want[(s.rank, s.op, s.mb, s.stage)] = s.end - s.start
    out = []
    for rank in range(measured.ranks):
        before, place = None, 0
        for s in sorted(measured.spans(COMPUTE, rank), key=lambda s: s.start):
            expected = want.get((s.rank, s.op, s.mb, s.stage))
            if before is None:
                context = "first"
            elif before.stage != s.stage:
                context = "switch"
            else:
                context = "repeat" if before.op == s.op else "same"
            place = place + 1 if context == "repeat" else 0
            if expected and expected > 0:
                out.append((s.op, context, place, (s.end - s.start) / expected))
            before = s
    return out


def op_time_ratio(predicted: Trace, measured: Trace) -> float:
    """Measured compute seconds over predicted, over all ranks."""
    def busy(trace: Trace) -> float:
        mask = trace.lane == COMPUTE
        return float((trace.end[mask] - trace.start[mask]).sum())

    return busy(measured) / busy(predicted)


def replay_errors(folder: Path, predicted: Trace, measured: Trace) -> tuple[float, float, float]:
    """(prediction, replay per task, replay per kind) makespan over measured - 1."""
    schedule = build(folder.name, measured.ranks, measured.microbatches)
    costs = load_costs(folder / "costs.json")
    held = compute_metrics(measured).makespan
    return tuple(compute_metrics(t).makespan / held - 1
                 for t in (predicted, replay(schedule, measured, costs, per="task"),
                           replay(schedule, measured, costs, per="kind")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders written by validate --out (searched below)")
    ap.add_argument("--replay", action="store_true", help="also the prediction against the run replayed per task "
                                                          "and per op kind")
    args = ap.parse_args()
    folders = run_folders(args.dirs)
    if not folders:
        print("op_context: no predicted.json beside a measured.json under " + ", ".join(map(str, args.dirs)),
              file=sys.stderr)
        return 2
    ratios: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    places: dict[tuple[str, str], list[float]] = defaultdict(list)
    per_model: dict[str, list[str]] = defaultdict(list)
    replays: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for folder in folders:
        try:
            predicted, measured = Trace.load(folder / "predicted.json"), Trace.load(folder / "measured.json")
        except (OSError, TraceError, ValueError) as e:
            print(f"op_context: {folder}: {e}", file=sys.stderr)
            return 2
        name = folder.name
        for op, context, place, r in op_ratios(predicted, measured):
            ratios[(name, op, context)].append(r)
            ratios[("all", op, context)].append(r)
            places[(op, PLACES[min(place, len(PLACES) - 1)])].append(r)
        error = compute_metrics(predicted).makespan / compute_metrics(measured).makespan - 1
        per_model[name].append(f"{op_time_ratio(predicted, measured) - 1:+.1%}/{error:+.1%}")
        if args.replay:
            try:
                replays[name].append(replay_errors(folder, predicted, measured))
            except (OSError, ValueError) as e:  # a schedule not built in, costs missing or of another run
                print(f"op_context: {folder}: no replay ({e})", file=sys.stderr)
    print(f"{len(folders)} runs; measured / predicted op time, median (ops), by what ran before the op on its rank")
    names = sorted({k[0] for k in ratios} - {"all"}) + ["all"]
    print(f"{'schedule':18s}{'op':4s}" + "".join(f"{c:>16s}" for c in CONTEXTS))
    for name in names:
        for op in SPAN_OPS:
            cells = [ratios.get((name, op, c)) for c in CONTEXTS]
            if not any(cells):
                continue
            print(f"{name:18s}{op:4s}" + "".join(f"{statistics.median(v):>10.3f} ({len(v):3d})" if v else f"{'-':>16s}"
                                               for v in cells))
    print("\nevery schedule: measured / predicted op time, median (ops), by the op's place in a run of its kind and stage")
    print(f"{'op':4s}" + "".join(f"{p:>16s}" for p in PLACES))
    for op in SPAN_OPS:
        cells = [places.get((op, p)) for p in PLACES]
        if any(cells):
            print(f"{op:4s}" + "".join(f"{statistics.median(v):>10.3f} ({len(v):3d})" if v else f"{'-':>16s}"
                                       for v in cells))
    print("\nper model: measured op time over predicted / makespan error (predicted / measured - 1)")
    for name in sorted(per_model):
        print(f"{name:18s}" + "  ".join(per_model[name]))
    if replays:
        print("\nmakespan over measured - 1, median over runs: predicted, replayed per task, replayed per op kind")
        for name in sorted(replays):
            cols = list(zip(*replays[name]))
            print(f"{name:18s}" + "".join(f"{statistics.median(c):>+10.1%}" for c in cols) + f"   ({len(cols[0])} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
