"""`pipesched plot`: the timeline figure of a saved Trace, or two traces compared
(--vs), and/or its Perfetto / Chrome trace (--perfetto)."""
from __future__ import annotations

import argparse
from pathlib import Path

from pipesched.simulator.trace import Trace

from ..errors import UsageError
from ..options import check_writable


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a saved trace (timeline, or against another with --vs)")
    p.add_argument("trace", metavar="TRACE.json", help="a trace written by `simulate --trace` or the executor")
    p.add_argument("--vs", metavar="OTHER.json",
                   help="draw TRACE against this trace of the same schedule; errors are the measured "
                        "one's relative to the other (if neither is measured: TRACE's relative to OTHER)")
    p.add_argument("-o", "--output", metavar="OUT.png|svg", help="write the figure here")
    p.add_argument("--perfetto", metavar="OUT.json", help="write TRACE as a Perfetto / Chrome trace")
    p.add_argument("--no-memory", action="store_true", help="leave out the memory panel")
    p.add_argument("--title", help="replace the figure's title")
    p.set_defaults(handler=run)


def write_perfetto(trace: Trace, path: str) -> None:
    """Write `trace` as a Perfetto / Chrome trace; UsageError if the file cannot be written."""
    from pipesched.simulator.perfetto import save_chrome_trace
    try:
        save_chrome_trace(trace, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    if not args.output and not args.perfetto:
        raise UsageError("plot needs -o OUT.png|svg or --perfetto OUT.json")
    if args.perfetto and args.vs:
        raise UsageError("--perfetto writes one trace; leave out --vs")
    for path in (args.output, args.perfetto):
        if path:
            check_writable(path)
    if args.output:
        from ..plots.style import check_output
        check_output(args.output)
    trace = Trace.load(args.trace)
    if args.perfetto:
        write_perfetto(trace, args.perfetto)
    if not args.output:
        return 0
    if args.vs is None:
        from ..plots.timeline import plot_timeline
        plot_timeline(trace, args.output, memory=not args.no_memory, title=args.title)
        return 0
    from ..plots.compare import plot_compare
    other = Trace.load(args.vs)
    mine, theirs = (trace, Path(args.trace).stem), (other, Path(args.vs).stem)
    # the prediction is the reference: the one not measured, else the --vs trace
    swap = other.source == "measured" and trace.source != "measured"
    (measured, m_name), (reference, r_name) = (theirs, mine) if swap else (mine, theirs)
    names = (reference.source, measured.source) if reference.source != measured.source else (r_name, m_name)
    plot_compare(reference, measured, args.output, names=names, memory=not args.no_memory, title=args.title)
    return 0
