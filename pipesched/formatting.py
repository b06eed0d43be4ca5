"""How times and sizes are written for people: shared by the CLI's tables and the figures."""
from __future__ import annotations

import math


def fmt_seconds(x: float) -> str:
    """Seconds in the unit that reads best (unit-time costs print as plain seconds)."""
    if x == 0 or abs(x) >= 1 or not math.isfinite(x):
        return f"{x:.6g} s"
    if abs(x) >= 1e-3:
        return f"{x * 1e3:.4g} ms"
    return f"{x * 1e6:.4g} us"


def fmt_bytes(x: float) -> str:
    """Bytes in binary units (KiB = 1024 B)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024:
            return f"{x:.0f} B" if unit == "B" else f"{x:.4g} {unit}"
        x /= 1024
    return f"{x:.4g} TiB"


def fmt_rel(x: float | None) -> str:
    """A relative error as a signed percentage; n/a where there is none."""
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f} %"
