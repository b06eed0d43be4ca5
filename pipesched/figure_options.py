"""Command-line options for figures and Perfetto files, shared by `plot` and `simulate`."""
from __future__ import annotations

import argparse

from pipesched.simulator.trace import Trace

from .errors import UsageError
from .plots import MAX_FIGURE_INCHES, MAX_FIGURE_PIXELS, FigureError, check_figure_size
from .terminal import wrote


def add_figure_args(parser: argparse.ArgumentParser) -> None:
    """--window, --figsize, --no-memory and --title: how a timeline figure is drawn."""
    g = parser.add_argument_group("figure")
    g.add_argument("--window", type=_pair("START,END"), metavar="START,END",
                   help="draw only this time window, seconds from the first op (e.g. 0.5,0.8)")
    g.add_argument("--figsize", type=_figsize, metavar="W,H", help="figure size in inches (default: 12 wide, "
                   f"as high as the ranks need; at most {MAX_FIGURE_INCHES:g} a side and {MAX_FIGURE_PIXELS:,} pixels)")
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


def _figsize(text: str) -> tuple[float, float]:
    """W,H inches within the figure bounds (`plots.check_figure_size`), checked as typed."""
    width, height = _pair("W,H")(text)
    try:
        check_figure_size(width, height)
    except FigureError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return width, height


def figure_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of plot_timeline / plot_compare that the figure flags give."""
    return {"memory": not args.no_memory, "title": args.title, "window": args.window, "figsize": args.figsize}


def write_perfetto(traces: Trace | list[tuple[str, Trace]], path: str, to_stderr: bool = False) -> None:
    """Write one trace, or several named ones, as a Perfetto / Chrome trace (atomically),
    and say so."""
    from pipesched.simulator.perfetto import save_chrome_trace
    save_chrome_trace(traces, path)
    wrote(path, to_stderr=to_stderr)


