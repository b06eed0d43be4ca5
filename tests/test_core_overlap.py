"""benchmarks/core_overlap.py: the share of compute time two ranks of one core overlap."""
from __future__ import annotations

import pytest

from helpers import benchmark_module
from pipesched.simulator.trace import COMPUTE, Span, Trace


def load():
    return benchmark_module("core_overlap")


def trace(spans):
    return Trace.from_spans("x", 2, 2, "measured", [Span(r, COMPUTE, "F", i, r, s, e) for i, (r, s, e) in enumerate(spans)])


def test_overlap_counts_the_time_both_ranks_compute():
    co = load()
    assert co.overlap([(0.0, 2.0), (4.0, 5.0)], [(1.0, 4.5)]) == pytest.approx(1.5)
    assert co.overlap([(0.0, 1.0)], [(1.0, 2.0)]) == 0.0
    # one core: rank 0 computes 0-2 s, rank 1 1-3 s; each is joined for 1 s of its 2
    assert co.both_busy_share(trace([(0, 0.0, 2.0), (1, 1.0, 3.0)]), cores=1) == pytest.approx(0.5)
    # two cores: nobody shares
    assert co.both_busy_share(trace([(0, 0.0, 2.0), (1, 1.0, 3.0)]), cores=2) == 0.0
