"""`pipesched plot`: the timeline figure of a saved Trace, or two traces compared
(--vs), and/or its Perfetto / Chrome trace (--perfetto)."""
from __future__ import annotations

import argparse
from pathlib import Path

from pipesched.schedules.outputs import atomic_path
from pipesched.simulator.trace import Trace

from ..errors import UsageError
from ..terminal import check_outputs, wrote


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
    """Write `trace` as a Perfetto / Chrome trace (atomically) and say so."""
    from pipesched.simulator.perfetto import save_chrome_trace
    save_chrome_trace(trace, path)
    wrote(path)


def run(args: argparse.Namespace) -> int:
    if not args.output and not args.perfetto:
        raise UsageError("plot needs -o OUT.png|svg or --perfetto OUT.json")
    if not args.output and (args.title or args.no_memory):  # they change the figure only
        raise UsageError(f"{'--title' if args.title else '--no-memory'} applies to the figure; add -o OUT.png|svg")
    if args.perfetto and args.vs:
        raise UsageError("--perfetto writes one trace; leave out --vs")
    check_outputs({"-o": args.output, "--perfetto": args.perfetto}, {"TRACE": args.trace, "--vs": args.vs})
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
        with atomic_path(args.output) as tmp:
            plot_timeline(trace, tmp, memory=not args.no_memory, title=args.title)
        wrote(args.output)
        return 0
    from ..plots.compare import plot_compare
    other = Trace.load(args.vs)
    mine, theirs = (trace, Path(args.trace).stem), (other, Path(args.vs).stem)
    # the prediction is the reference: the one not measured, else the --vs trace
    swap = other.source == "measured" and trace.source != "measured"
    (measured, m_name), (reference, r_name) = (theirs, mine) if swap else (mine, theirs)
    names = (reference.source, measured.source) if reference.source != measured.source else (r_name, m_name)
    with atomic_path(args.output) as tmp:
        plot_compare(reference, measured, tmp, names=names, memory=not args.no_memory, title=args.title)
    wrote(args.output)
    return 0
