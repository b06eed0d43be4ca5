"""benchmarks/validate_dp.py: how far launches of one command are apart."""
from __future__ import annotations

import pytest

from helpers import benchmark_module


def test_launches_apart_is_each_launch_against_its_schedules_median_launch():
    bench = benchmark_module("validate_dp")
    apart = bench.launches_apart({"1f1b": [0.4, 0.5, 0.6], "zb-v": [0.3, 0.33], "gpipe": [0.45]})
    # 1F1B's median launch is 0.5 s: 20 %, 0, 20 %; ZB-V's two launches' median is 0.315 s; GPipe ran once
    assert apart == pytest.approx([0.2, 0.0, 0.2, 0.015 / 0.315, 0.015 / 0.315])
    assert bench.launches_apart({"1f1b": [0.4]}) == []
