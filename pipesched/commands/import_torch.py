"""`pipesched import-torch`: a torch.distributed.pipelining schedule as a schedule file."""
from __future__ import annotations

import argparse
import sys

from pipesched.schedules import fileformat
from pipesched.schedules.validate import validate

from ..errors import UsageError
from ..options import add_schedule_args, load_schedule
from ..terminal import check_outputs, printable, wrote


def add_parser(sub) -> None:
    p = sub.add_parser("import-torch", help="convert a torch.distributed.pipelining schedule (class name or CSV dump)")
    add_schedule_args(p, "NAME|FILE.csv", "torch class name (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, "
                      "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) or a CSV written by torch's _dump_csv", costs=False)
    p.add_argument("-o", "--output", metavar="FILE.json", help="schedule file to write (default: stdout)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.output and not args.output.endswith(".json"):
        raise UsageError(f"-o must name a .json schedule file, got {args.output!r}")
    check_outputs({"-o": args.output}, {"FILE.csv": args.schedule})
    source = args.schedule if args.schedule.endswith(".csv") else f"torch:{args.schedule.removeprefix('torch:')}"
    schedule = load_schedule(source, args.ranks, args.microbatches, args.chunks, recompute=args.recompute)
    validate(schedule)
    if args.output:
        fileformat.save(schedule, args.output)
        wrote(args.output, f"{printable(schedule.name)}, {schedule.ranks} ranks, {schedule.microbatches} microbatches")
    else:
        sys.stdout.write(fileformat.dumps(schedule))
    return 0
