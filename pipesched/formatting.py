"""How times and sizes are written for people: shared by the CLI's tables and the figures
(`fmt_seconds` and `fmt_bytes` live with the unit parsers in `simulator.units`, so the
library's messages say them the same way)."""
from __future__ import annotations

import math

from pipesched.simulator.units import fmt_bytes, fmt_seconds

__all__ = ["fmt_bytes", "fmt_rel", "fmt_seconds"]


def fmt_rel(x: float | None) -> str:
    """A relative error as a signed percentage; n/a where there is none."""
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f} %"
