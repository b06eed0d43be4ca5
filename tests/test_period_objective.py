"""zb-auto's objective without a step barrier: the free-transfer period (schedules.steady),
the weighted activation count its plays use under the paper's memory model, and the
zero-bubble paper's Table 5 from its own profiled costs (benchmarks/zb_paper.py)."""
from __future__ import annotations

import pytest

from helpers import benchmark_module
from pipesched.schedules.activations import activations_per_rank, peak_activations
from pipesched.schedules.bounded import Play, play_bounded
from pipesched.schedules.ir import ScheduleError, looped_stages, uniform_paths
from pipesched.schedules.registry import build
from pipesched.schedules.steady import period_under, step_matrix_under
from pipesched.schedules.timeline import makespan_under
from pipesched.schedules.validate import validate
from pipesched.simulator.budget import Budget
from pipesched.simulator.costs import uniform
from pipesched.simulator.steps import steady_period


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-1f1b"])
def test_free_transfer_period_is_the_simulators(name):
    costs = uniform(1, 2, 1)
    op_time = costs.op_time_for(4)
    schedule = build(name, 4, 12, None, op_time)
    assert period_under(schedule, op_time) == pytest.approx(steady_period(validate(schedule), costs, "none"))


def test_step_matrix_of_one_rank_is_its_work():
    op_time = uniform(1, 2, 1).op_time_for(1)
    a = step_matrix_under(build("1f1b", 1, 5), op_time)
    assert a.tolist() == [[5 * (1 + 3)]]  # F then fused BW (B + W), five microbatches


# (p, m, F,B,W, v, max_activations): shapes where the two objectives may pick differently
SHAPES = [(4, 8, (1, 1, 1), None, None), (4, 8, (1, 1, 1), None, 4), (4, 8, (1, 1, 1), 1, None),
          (4, 8, (1, 2, 1), None, 3), (8, 24, (1, 1, 1), 1, None)]


@pytest.mark.parametrize("p,m,fbw,v,limit", SHAPES)
def test_zb_auto_without_a_barrier_repeats_no_slower(p, m, fbw, v, limit):
    op_time = uniform(*fbw).op_time_for(p)
    for_makespan = build("zb-auto", p, m, v, op_time, max_activations=limit)
    for_period = build("zb-auto", p, m, v, op_time, max_activations=limit, step_barrier="none")
    assert peak_activations(for_period) <= (limit or 2 * p) + 1e-9
    assert period_under(for_period, op_time) <= period_under(for_makespan, op_time) + 1e-9


def test_zb_auto_without_a_barrier_finds_a_faster_period_than_the_makespan_objective():
    # p = 4, m = 8, F = B = W: the makespan objective keeps a V (25.5, repeating at 25.5);
    # without a barrier a one-chunk order reaches the work bound m(F+B+W) = 24 per step
    op_time = uniform(1, 1, 1).op_time_for(4)
    for_makespan = build("zb-auto", 4, 8, None, op_time)
    for_period = build("zb-auto", 4, 8, None, op_time, step_barrier="none")
    assert period_under(for_makespan, op_time) == 25.5 == makespan_under(for_makespan, op_time)
    assert period_under(for_period, op_time) == 24.0
    assert makespan_under(for_period, op_time) > 25.5  # a longer step that repeats faster


def test_zb_auto_takes_only_the_two_step_barriers():
    with pytest.raises(ScheduleError, match="step_barrier"):
        build("zb-auto", 2, 4, 1, step_barrier="some")
    with pytest.raises(ScheduleError, match="weight_share"):
        build("zb-auto", 2, 4, 1, weight_share=1.5)


def test_weighted_count_frees_the_rest_at_b():
    schedule = build("zb-h2", 2, 3)  # rank 1: F0 B0 F1 B1 F2 B2 W0 W1 W2
    assert activations_per_rank(schedule) == [3.0, 3.0]
    assert activations_per_rank(schedule, 0.5) == [3.0, 2.0]
    assert activations_per_rank(schedule, 0.0) == [3.0, 1.0]


@pytest.mark.parametrize("kept", [1.0, 0.4])
def test_play_holds_its_limit_under_its_own_count(kept):
    stages = looped_stages(4, 1)
    paths, mb_paths = uniform_paths(stages, 12)
    for prefer in ("alternate", "forward"):
        for reserve in (False, True):
            s = play_bounded("t", 4, 12, stages, paths, mb_paths, Play(4, prefer, reserve=reserve, kept=kept))
            validate(s)
            assert peak_activations(s, kept) <= 4 + 1e-9
    # freeing at B lets the forward-first play run more forwards: over 4 by the F-to-W count
    assert (peak_activations(s) > 4) == (kept < 1)


def test_weight_share_only_under_a_byte_limit_with_weight_memory():
    costs = uniform(1, 1, 1, activation_memory=100.0, weight_memory=40.0)
    assert Budget(memory_limit=1000.0).weight_share(costs) == 0.4
    assert Budget(max_activations=4, memory_limit=1000.0).weight_share(costs) == 1.0
    assert Budget(memory_limit=1000.0).weight_share(uniform(1, 1, 1, activation_memory=100.0)) == 1.0


def test_paper_table5_row_within_a_fifth_of_a_point():
    bench = benchmark_module("zb_paper")
    row = next(r for r in bench.ROWS if r.model == "6.2B" and r.m == 24)
    ours = bench.bubbles(row, ("1f1b", "zb-1p", "zb-2p"))
    for column in ("1f1b", "zb-1p", "zb-2p"):
        assert ours[column][0] == pytest.approx(row.published[column], abs=bench.WITHIN), column
