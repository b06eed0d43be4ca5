"""`pipesched show`: a schedule's per-rank programs, or its file (--json)."""
from __future__ import annotations

import argparse
import sys

from pipesched.schedules import fileformat
from pipesched.schedules.graph import unit_label
from pipesched.schedules.validate import validate

from ..options import add_schedule_args, schedule_from_args
from ..terminal import printable


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="per-rank programs of a schedule")
    add_schedule_args(p)
    p.add_argument("--json", action="store_true", help="print the schedule file (pipesched.schedule/1)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    graph = validate(schedule)
    if args.json:
        sys.stdout.write(fileformat.dumps(schedule))
        return 0
    print(f"{printable(schedule.name)}: {schedule.ranks} ranks, {schedule.microbatches} microbatches, "
          f"{schedule.num_model_stages} model stages on {len(schedule.stages)} virtual stages, "
          f"{len(schedule.paths)} path{'s' if len(schedule.paths) > 1 else ''}, {len(graph.tasks)} ops")
    print("ops: F forward, B input backward, W weight backward, BW full backward, R recompute-forward, X+Y overlapped; "
          "F3@1 = F of microbatch 3 on virtual stage 1")
    for r, (units, stages) in enumerate(zip(graph.rank_units, schedule.stages_by_rank())):
        held = ", ".join(f"{s} (model {schedule.stages[s].model_stage})" for s in stages)
        print(f"rank {r} [stages {held}]:")
        print("  " + " ".join(unit_label(graph, u) for u in units))
    return 0
