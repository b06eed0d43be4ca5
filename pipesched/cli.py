"""The `pipesched` command line: one subcommand per module in pipesched.commands.

Bad input of any kind is one line on stderr and exit status 2; no tracebacks.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import INPUT_ERRORS, UsageError

COMMANDS = ("list", "show", "simulate", "sweep", "plan", "plot", "run", "calibrate", "validate",
            "import-torch", "export-torch")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, module in available_commands().items():
        module.add_parser(sub)  # type: ignore[attr-defined]
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args) or 0)
    except INPUT_ERRORS as exc:
        print(f"pipesched: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("pipesched: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("PIPESCHED_DEBUG"):
            raise
        print(f"pipesched: internal error: {type(exc).__name__}: {exc} (set PIPESCHED_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
