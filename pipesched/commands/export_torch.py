"""`pipesched export-torch`: a schedule as torch's CSV action format (compute only).

The file is what torch's `_PipelineScheduleRuntime._load_csv(path)` reads; torch adds
the communication itself. `--check` loads it that way in this process (needs torch).
"""
from __future__ import annotations

import argparse
import csv
import sys

from pipesched.schedules.outputs import write_text
from pipesched.schedules.torch_format import rows_csv, to_rows
from pipesched.schedules.validate import validate

from ..errors import UsageError
from ..options import add_schedule_args, schedule_from_args
from ..terminal import check_outputs, wrote


def add_parser(sub) -> None:
    p = sub.add_parser("export-torch", help="write a schedule in torch.distributed.pipelining's CSV format")
    add_schedule_args(p)
    p.add_argument("-o", "--output", metavar="FILE.csv", help="CSV to write (default: stdout)")
    p.add_argument("--no-overlap", action="store_true",
                   help="write overlapped pairs as two consecutive actions (torch < 2.9 has no OVERLAP_F_B)")
    p.add_argument("--check", action="store_true",
                   help="load the result with torch's _PipelineScheduleRuntime._load_csv first (needs torch)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.output and not args.output.endswith(".csv"):
        raise UsageError(f"-o must name a .csv file, got {args.output!r}")
    check_outputs({"-o": args.output}, {"SCHEDULE": args.schedule})
    schedule = schedule_from_args(args)
    validate(schedule)
    rows = to_rows(schedule, overlap=not args.no_overlap)
    if args.check:
        try:
            from pipesched.executor.torch_runtime import case_from_rows, check_loads
        except ImportError as exc:
            raise UsageError(f"--check needs torch (pip install 'pipesched[torch]'): {exc}") from None
        check_loads(case_from_rows(rows, schedule.name))
    if args.output:
        write_text(args.output, rows_csv(rows), newline="")
        wrote(args.output, "load it with torch's _PipelineScheduleRuntime._load_csv(path) "
              "(format='compute_only'); action stage k is model stage k" + (", checked" if args.check else ""))
    else:
        csv.writer(sys.stdout).writerows(rows)
    return 0
