"""Errors the CLI reports as one line and exit status 2 (bad input of any kind)."""
from __future__ import annotations

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.outputs import OutputError
from pipesched.simulator.budget import BudgetError
from pipesched.simulator.costs import CostError
from pipesched.simulator.trace import TraceError

from .plots import FigureError


class UsageError(ValueError):
    """Bad command-line arguments or files that no more specific error covers."""


INPUT_ERRORS: tuple[type[BaseException], ...] = (UsageError, ScheduleError, CostError, TraceError,
                                                     FigureError, OutputError, BudgetError)
