"""Predicted vs measured maths on synthetic traces: known offsets give known errors."""
import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.compare import compare
from pipesched.simulator.costs import uniform
from pipesched.simulator.trace import COMPUTE, Trace


def predicted():
    return simulate(validate(build("1f1b", 4, 8)), uniform(1, 1, 1, activation_memory=10))


def test_a_trace_against_itself_has_no_error():
    c = compare(predicted(), predicted())
    assert c.makespan_rel_error == 0 and c.bubble_abs_error == 0
    assert c.start_time_error_p50 == 0 and c.start_time_error_p90 == 0
    assert c.peak_memory_rel_error == 0 and c.matched_ops == 4 * 8 * 2


def test_a_clock_offset_costs_nothing():
    c = compare(predicted(), predicted().shifted(123.4))
    assert abs(c.makespan_rel_error) < 1e-12 and c.start_time_error_p90 < 1e-12


def test_a_uniformly_slower_run_gives_the_known_errors():
    slow = simulate(validate(build("1f1b", 4, 8)), uniform(1.1, 1.1, 1.1, activation_memory=8))
    c = compare(predicted(), slow)
    assert c.makespan_rel_error == pytest.approx(1 / 1.1 - 1)   # 33 vs 36.3
    assert c.bubble_abs_error == pytest.approx(0, abs=1e-12)     # same shape, same bubble
    assert c.peak_memory_rel_error == pytest.approx(10 / 8 - 1)  # 40 vs 32 on rank 0
    # each op starts 10% later in the measured run: error = 0.1 * start / measured makespan
    starts = np.sort(predicted().start[predicted().lane == COMPUTE])
    expected = np.percentile(0.1 * starts / 36.3, 50)
    assert c.start_time_error_p50 == pytest.approx(expected)
    f = next(o for o in c.per_op if o.op == "F")
    assert f.measured_median == pytest.approx(1.1) and f.rel_error == pytest.approx(1 / 1.1 - 1)


def test_a_delayed_rank_moves_only_its_ops():
    base = predicted()
    late = Trace(**{**base.__dict__, "start": base.start.copy(), "end": base.end.copy()})
    on_rank3 = (late.rank == 3) & (late.lane == COMPUTE)
    late.start[on_rank3] += 0.5
    late.end[on_rank3] += 0.5
    c = compare(base, late)
    measured_makespan = max(late.end[late.lane == COMPUTE])
    assert c.start_time_error_p90 == pytest.approx(0.5 / measured_makespan)
    assert c.start_time_error_p50 == 0.0  # three quarters of the ops did not move


def test_traces_of_different_shapes_are_refused():
    other = simulate(validate(build("1f1b", 2, 8)), uniform())
    with pytest.raises(ValueError, match="differ in shape"):
        compare(predicted(), other)
