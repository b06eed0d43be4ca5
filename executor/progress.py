"""Progress lines from rank 0 of a long command (calibrating, steps) on stderr.

The CLI turns them on (`PIPESCHED_PROGRESS=1`, inherited by the ranks it launches);
library calls stay quiet. A step is reported only when the last line is a few seconds
old, so short runs print a handful of lines and long ones show they are alive.
"""
from __future__ import annotations

import os
import sys
import time

ENV = "PIPESCHED_PROGRESS"
EVERY = 3.0  # seconds between step lines

_last = [0.0]


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def say(rank: int, message: str, *, step: bool = False) -> None:
    """Print `message` (rank 0 only, when enabled); `step` lines at most every EVERY s."""
    if rank != 0 or not enabled():
        return
    now = time.monotonic()
    if step and now - _last[0] < EVERY:
        return
    _last[0] = now
    print(f"pipesched: {message}", file=sys.stderr, flush=True)
