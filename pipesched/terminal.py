"""What the CLI prints about names and files: names made safe for a terminal, every
written file announced, and outputs checked before work starts."""
from __future__ import annotations

import os
import sys
import time
import unicodedata
from typing import Mapping, TextIO

from pipesched.schedules.outputs import OutputError, check_distinct, check_writable

PROGRESS_AFTER_S = 2.0  # on a non-terminal stderr, report progress only for work this long
_UNSAFE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format (bidi), surrogates, unassigned


def printable(text: object) -> str:
    """`text` with every control character (NUL, escape sequences, carriage return,
    bidirectional overrides, line separators) written as a Python escape, so a name from
    a file cannot move the cursor, recolour or clear the terminal. Everything else, any
    script included, is kept as it is."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in _UNSAFE:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def wrote(path: str | os.PathLike, what: str = "", to_stderr: bool = False) -> None:
    """Announce a written file: "wrote PATH" (plus `what`), one line. On stderr when
    stdout carries a document (--json), so the document stays parseable."""
    print(f"wrote {printable(os.fspath(path))}{': ' + what if what else ''}",
          file=sys.stderr if to_stderr else sys.stdout)


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    print(f"pipesched: warning: {message}", file=sys.stderr)


def check_outputs(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] = {}) -> None:
    """Before any work: every given output can be written, none is also an input, no two
    are the same file (OutputError, one line, exit 2)."""
    for flag, path in outputs.items():
        if path is not None and not str(path):
            raise OutputError(f"{flag} '' names no file; leave {flag} out to write nothing")
        if path:
            check_writable(path)
    check_distinct(outputs, {k: v for k, v in inputs.items() if v and os.path.exists(v)})


class Progress:
    """A one-line progress bar on `stream` (stderr): redrawn in place on a terminal;
    elsewhere a line per tenth, and only once the work has run `after_s` seconds."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, width: int = 30,
                 after_s: float | None = None):
        # sys.stderr looked up now, not at import: callers (and tests) may have replaced it
        self.label, self.total, self.stream, self.width = label, max(1, total), stream or sys.stderr, width
        self.after_s = PROGRESS_AFTER_S if after_s is None else after_s
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self.shown = 0  # tenths already reported on a non-terminal
        self.drawn = False

    def __call__(self, done: int, what: str) -> None:
        elapsed = time.monotonic() - self.t0
        if self.tty:
            full = self.width * done // self.total
            self.stream.write(f"\r{self.label} [{'#' * full}{'.' * (self.width - full)}] {done}/{self.total} "
                              f"{elapsed:.0f}s {what:<30.30}")
            self.drawn = True
        elif elapsed >= self.after_s and 10 * done // self.total > self.shown:
            self.shown = 10 * done // self.total
            self.stream.write(f"{self.label}: {done}/{self.total} done after {elapsed:.0f} s\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
