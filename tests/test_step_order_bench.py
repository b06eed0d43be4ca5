"""benchmarks/step_order.py: steps compared round by round."""
from __future__ import annotations

import pytest

from helpers import benchmark_module


def test_steps_are_paired_by_round_and_refused_unpaired():
    bench = benchmark_module("step_order")
    assert bench.paired_ratios([1.1, 2.0, 3.3], [1.0, 2.0, 3.0]) == pytest.approx([1.1, 1.0, 1.1])
    with pytest.raises(ValueError, match="3 steps against 2"):
        bench.paired_ratios([1.0, 2.0, 3.0], [1.0, 2.0])

