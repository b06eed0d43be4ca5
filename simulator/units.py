"""Quantities with units, as written by hand on the command line and in cost files.

"12ms", "1.5us", "2 s" are seconds; "128MiB", "40GiB", "3e9", "1.5GB" are bytes
(KiB/MiB/GiB/TiB are powers of 1024, kB/MB/GB/TB powers of 1000); "50GB/s", "400Gb/s"
(bits) are bytes per second. A plain number keeps the base unit: seconds, bytes,
bytes per second. Anything else is a UnitError naming what was expected; the sign and
finiteness are left to the option or cost field's own check, which names it.
`fmt_seconds` and `fmt_bytes` write them back for people (messages, tables, figures).
"""
from __future__ import annotations

import math
import re

TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
SIZE = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
        "kib": 1024.0, "mib": 1024.0 ** 2, "gib": 1024.0 ** 3, "tib": 1024.0 ** 4}
BITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}

_NUMBER = re.compile(r"(?i)^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan))\s*([A-Za-zµ/]*)\s*$")


class UnitError(ValueError):
    """A quantity that is not a number with a unit of the expected kind."""


def _split(text: str, kind: str, examples: str) -> tuple[float, str]:
    match = _NUMBER.match(text) if isinstance(text, str) else None
    if not match:
        raise UnitError(f"expected {kind} such as {examples}, got {text!r}")
    return float(match.group(1)), match.group(2)


def parse_seconds(text: str | float) -> float:
    """"12ms" -> 0.012; a plain number is seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    number, unit = _split(text, "a time", "12ms, 1.5us or 0.2 (seconds)")
    if unit and unit.lower() not in TIME and unit not in TIME:
        raise UnitError(f"unknown time unit {unit!r} in {text!r}; use s, ms, us or ns")
    return number * (TIME.get(unit) or TIME.get(unit.lower(), 1.0) if unit else 1.0)


def parse_bytes(text: str | float) -> float:
    """"128MiB" -> 134217728; a plain number is bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    number, unit = _split(text, "a size", "128MiB, 40GiB, 1.5GB or 4096 (bytes)")
    if unit and unit.lower() not in SIZE:
        raise UnitError(f"unknown size unit {unit!r} in {text!r}; use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB")
    return number * (SIZE[unit.lower()] if unit else 1.0)


def parse_bandwidth(text: str | float) -> float:
    """"50GB/s" -> 5e10 bytes per second; "400Gbit/s" counts bits; a plain number is bytes/s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    number, unit = _split(text, "a bandwidth", "50GB/s, 25GiB/s, 400Gbit/s or 1e10 (bytes per second)")
    if unit:
        if not unit.endswith("/s"):
            raise UnitError(f"a bandwidth needs a per-second unit such as GB/s, got {text!r}")
        base = unit[:-2].lower()
        scale = SIZE.get(base) or BITS.get(base)
        if scale is None:
            raise UnitError(f"unknown bandwidth unit {unit!r} in {text!r}; use B/s, MB/s, GB/s, GiB/s or Gbit/s")
        number *= scale
    return number


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
