"""benchmarks/validate_many.py: the loss of a user who follows the command's pick and advice."""
from __future__ import annotations

import pytest

from helpers import benchmark_module

bench = benchmark_module("validate_many")


def doc(measured: dict[str, float], pick: str, settled: bool, to_measure: tuple[str, ...]) -> dict:
    fastest = min(measured, key=measured.__getitem__)
    return {"schedules": [{"schedule": n, "measured": {"makespan": t}} for n, t in measured.items()],
            "ranking": {"predicted_fastest": pick, "measured_fastest": fastest, "by": "makespan",
                        "pick_over_fastest": measured[pick] / measured[fastest] - 1,
                        "confidence": {"settled": settled, "to_measure": list(to_measure)}}}


def test_a_settled_pick_costs_what_it_measured():
    assert bench.advised_loss(doc({"a": 1.2, "b": 1.0}, "a", True, ("a",))) == (True, pytest.approx(0.2))


def test_an_unsettled_pick_costs_the_best_of_the_schedules_it_named():
    # named a and b: the user measures both and keeps b, 5 % over the fastest (c)
    got = bench.advised_loss(doc({"a": 1.2, "b": 1.05, "c": 1.0}, "a", False, ("a", "b")))
    assert got == (False, pytest.approx(0.05))
    # named the fastest: no loss
    assert bench.advised_loss(doc({"a": 1.2, "c": 1.0}, "a", False, ("a", "c")))[1] == pytest.approx(0.0)


def test_without_a_confidence_the_pick_stands():
    d = doc({"a": 1.1, "b": 1.0}, "a", True, ("a",))
    d["ranking"]["confidence"] = None
    assert bench.advised_loss(d) == (True, pytest.approx(0.1))
