"""How times and sizes are written for people: shared by the CLI's tables and the figures
(`fmt_seconds` and `fmt_bytes` live with the unit parsers in `simulator.units`, so the
library's messages say them the same way)."""
from __future__ import annotations

import json
import math

from pipesched.simulator.units import fmt_bytes, fmt_seconds

__all__ = ["fmt_bytes", "fmt_rel", "fmt_seconds", "json_text"]


def fmt_rel(x: float | None) -> str:
    """A relative error as a signed percentage; n/a where there is none."""
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f} %"


def _finite(data):
    """`data` with every float that is not finite replaced by None (JSON has no inf or nan)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def json_text(data, indent: int | None = 1) -> str:
    """Strict JSON for --json output: inf and nan (degenerate costs, e.g. a throughput of
    a zero-length step) are written as null, never as `Infinity`."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)
