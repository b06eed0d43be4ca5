"""`pipesched plot`: the timeline figure of a saved Trace, or two traces compared
(--vs), and/or their Perfetto / Chrome trace (--perfetto)."""
from __future__ import annotations

import argparse
from pathlib import Path

from pipesched.simulator.trace import Trace

from ..errors import UsageError
from ..figure_options import add_figure_args, check_figure_args, figure_options, write_perfetto
from ..terminal import check_outputs, wrote


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a saved trace (timeline, or against another with --vs)")
    p.add_argument("trace", metavar="TRACE.json", help="a trace written by `simulate --trace` or the executor")
    p.add_argument("--vs", metavar="OTHER.json",
                   help="draw TRACE against this trace of the same schedule; errors are the measured "
                        "one's relative to the other (if neither is measured: TRACE's relative to OTHER)")
    p.add_argument("-o", "--output", metavar="OUT.png|svg", help="write the figure here")
    p.add_argument("--perfetto", metavar="OUT.json",
                   help="write TRACE (and the --vs trace) as a Perfetto / Chrome trace")
    add_figure_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.output and not args.perfetto:
        raise UsageError("plot needs -o OUT.png|svg or --perfetto OUT.json")
    check_figure_args(args, args.output, "-o")
    check_outputs({"-o": args.output, "--perfetto": args.perfetto}, {"TRACE": args.trace, "--vs": args.vs})
    if args.output:
        from ..plots.style import check_output
        check_output(args.output)
    trace = Trace.load(args.trace)
    other = Trace.load(args.vs) if args.vs else None
    mine = (trace, Path(args.trace).stem)
    theirs = (other, Path(args.vs).stem) if other is not None else None
    if args.perfetto:
        write_perfetto(trace if theirs is None else [(f"{mine[1]} ({trace.source})", trace),
                                                     (f"{theirs[1]} ({other.source})", other)], args.perfetto)
    if not args.output:
        return 0
    if theirs is None:
        from ..plots.timeline import plot_timeline
        plot_timeline(trace, args.output, **figure_options(args))
        wrote(args.output)
        return 0
    from ..plots.compare import plot_compare
    # the prediction is the reference: the one not measured, else the --vs trace
    swap = other.source == "measured" and trace.source != "measured"
    (measured, m_name), (reference, r_name) = (theirs, mine) if swap else (mine, theirs)
    names = (reference.source, measured.source) if reference.source != measured.source else (r_name, m_name)
    plot_compare(reference, measured, args.output, names=names, **figure_options(args))
    wrote(args.output)
    return 0
