"""The `pipesched` command line: one subcommand per module in pipesched.commands.

Bad input of any kind is one line on stderr and exit status 2; no tracebacks. SIGINT,
SIGTERM and SIGHUP stop a command with one line and exit status 128 + signal, removing
any half-written output (and, for run, calibrate and validate, stopping every rank).
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .errors import INPUT_ERRORS, UsageError

COMMANDS = ("list", "show", "simulate", "sweep", "plan", "plot", "run", "calibrate", "validate",
            "import-torch", "export-torch", "costs")


class ArgumentError(UsageError):
    """A usage error argparse found; `prog` (e.g. `pipesched simulate`) leads its line."""

    def __init__(self, message: str, prog: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line: `PROG: error: MESSAGE`, where PROG is
    `pipesched` or `pipesched COMMAND` (main prints it; the message does not repeat it)."""

    def error(self, message: str):  # type: ignore[override]
        raise ArgumentError(message, self.prog)


def version() -> str:
    """The installed distribution's version; the package's own where it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version as installed
        try:
            return installed("pipesched")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    from . import __version__
    return __version__


def available_commands() -> dict[str, object]:
    found = {}
    for name in COMMANDS:
        try:
            found[name] = importlib.import_module(f"pipesched.commands.{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pipesched.commands.{name.replace('-', '_')}":
                raise
    return found


def build_parser() -> Parser:
    parser = Parser(prog="pipesched", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pipesched {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, module in available_commands().items():
        module.add_parser(sub)  # type: ignore[attr-defined]
    return parser


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a command runs; unwinds like Ctrl-C so that clean-ups
    (temporary output files, rank processes) run."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextmanager
def stop_signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` while the command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Stopped(signum)

    previous = {num: signal.signal(num, handler)
                for num in (getattr(signal, name, None) for name in ("SIGTERM", "SIGHUP")) if num is not None}
    try:
        yield
    finally:
        for num, old in previous.items():
            signal.signal(num, old)


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` (default: the process's arguments) and return its exit
    status. As the program itself (`argv` None), a thread still running when the command
    is done (one a --model function started, or a model check cut short by --timeout or
    a signal) does not keep the process alive: the output is flushed and the process
    exits at once with the status."""
    code = _run(argv)
    if argv is None and any(t.is_alive() for t in threading.enumerate() if t is not threading.current_thread()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    return code


def _run(argv: list[str] | None) -> int:
    try:
        # numpy's and matplotlib's RuntimeWarnings (overflow, invalid value) are not for
        # the user: a result that is not finite is refused in one line where it matters
        with stop_signals_unwind(), warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as done:  # --help or --version printed
                return done.code if isinstance(done.code, int) else 0
            return int(args.handler(args) or 0)
    except INPUT_ERRORS as exc:
        print(f"{getattr(exc, 'prog', None) or 'pipesched'}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C, or Stopped / the launcher's Interrupted
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"pipesched: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 128 + int(signum)
    except Exception as exc:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("PIPESCHED_DEBUG"):
            raise
        print(f"pipesched: internal error: {type(exc).__name__}: {exc} (set PIPESCHED_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
