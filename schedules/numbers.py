"""What counts as a number in files and arguments. Python's bool is an int; here it is
never a count or a time, so `true` in a JSON file is refused where a number belongs."""
from __future__ import annotations


def is_int(x: object) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """An int or float that is not a bool (nan and inf included: callers bound them)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)
