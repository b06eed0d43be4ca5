"""`pipesched export-torch`: a schedule as torch's CSV action format (compute only)."""
from __future__ import annotations

import argparse
import csv
import sys

from schedules.torch_format import to_rows
from schedules.validate import validate

from ..errors import UsageError
from ..options import add_schedule_args, schedule_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("export-torch", help="write a schedule in torch.distributed.pipelining's CSV format")
    add_schedule_args(p)
    p.add_argument("-o", "--output", metavar="FILE.csv", help="CSV to write (default: stdout)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    validate(schedule)
    rows = to_rows(schedule)
    if args.output:
        if not args.output.endswith(".csv"):
            raise UsageError(f"-o must name a .csv file, got {args.output!r}")
        with open(args.output, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
        print(f"wrote {args.output}: load it with torch's _PipelineScheduleRuntime._load_csv "
              f"(format='compute_only')")
    else:
        csv.writer(sys.stdout).writerows(rows)
    return 0
