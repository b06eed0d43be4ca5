"""benchmarks/core_interruptions.py: reading the time a core was taken away from clock gaps."""
from __future__ import annotations

import pytest

from helpers import benchmark_module


@pytest.fixture(scope="module")
def interruptions():
    return benchmark_module("core_interruptions")


def test_coinciding_counts_gaps_with_one_on_the_other_core_nearby(interruptions):
    core0 = [(1.0, 0.003), (2.0, 0.002), (5.0, 0.004)]
    core1 = [(1.001, 0.003), (4.0, 0.001), (5.0025, 0.002)]
    assert interruptions.coinciding(core0, core1) == 1            # 1.0 only: 5.0 is 2.5 ms apart
    assert interruptions.coinciding(core0, core1, within=3e-3) == 2
    assert interruptions.coinciding(core0, []) == 0


def test_clock_gaps_reports_jumps_of_the_clock_over_the_threshold(interruptions, monkeypatch):
    # readings 10 us apart for 10 ms, with one jump of 5 ms (time taken away) and one of
    # 50 us (under the threshold)
    readings = [0.0] + [i * 10e-6 for i in range(201)]
    readings += [r + 5e-3 for r in readings[-1:]]
    readings += [readings[-1] + i * 10e-6 for i in range(1, 200)]
    readings += [readings[-1] + 50e-6]
    readings += [readings[-1] + i * 10e-6 for i in range(1, 400)]
    clock = iter(readings)
    monkeypatch.setattr(interruptions.time, "perf_counter", lambda: next(clock))
    gaps = interruptions.clock_gaps(0.01)
    assert len(gaps) == 1
    when, took = gaps[0]
    assert when == pytest.approx(2e-3) and took == pytest.approx(5e-3)
