"""Command-line options for figures and Perfetto files, shared by `plot` and `simulate`."""
from __future__ import annotations

import argparse

from pipesched.simulator.trace import Trace

from .errors import UsageError
from .terminal import wrote


def add_figure_args(parser: argparse.ArgumentParser) -> None:
    """--window, --figsize, --no-memory and --title: how a timeline figure is drawn."""
    g = parser.add_argument_group("figure")
    g.add_argument("--window", type=_pair("START,END"), metavar="START,END",
                   help="draw only this time window, seconds from the first op (e.g. 0.5,0.8)")
    g.add_argument("--figsize", type=_pair("W,H"), metavar="W,H", help="figure size in inches (default: 12 wide, "
                   "as high as the ranks need)")
    g.add_argument("--no-memory", action="store_true", help="leave out the memory panel")
    g.add_argument("--title", help="replace the figure's title")


def check_figure_args(args: argparse.Namespace, output: str | None, flag: str) -> None:
    """UsageError when figure flags are given but no figure is drawn (`output` is None)."""
    given = [name for name, on in (("--window", args.window is not None), ("--figsize", args.figsize is not None),
                                   ("--no-memory", args.no_memory), ("--title", args.title is not None)) if on]
    if given and output is None:
        raise UsageError(f"{', '.join(given)} only shape{'s' if len(given) == 1 else ''} a figure: add {flag} OUT.png")


def _pair(what: str):
    def parse(text: str) -> tuple[float, float]:
        try:
            a, b = (float(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} (two numbers and a comma), got {text!r}") from None
        return a, b
    return parse


def figure_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of plot_timeline / plot_compare that the figure flags give."""
    return {"memory": not args.no_memory, "title": args.title, "window": args.window, "figsize": args.figsize}


def write_perfetto(traces: Trace | list[tuple[str, Trace]], path: str, to_stderr: bool = False) -> None:
    """Write one trace, or several named ones, as a Perfetto / Chrome trace (atomically),
    and say so."""
    from pipesched.simulator.perfetto import save_chrome_trace
    save_chrome_trace(traces, path)
    wrote(path, to_stderr=to_stderr)


