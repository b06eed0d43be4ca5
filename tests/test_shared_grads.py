"""The shared-gradient sums at each step's end (simulator.shared_grads): which ranks sum,
what the sum costs by hand, and how it enters the step's end, the barrier's period and
the max-plus period of steps back to back (simulator.steps), against hand-derived
numbers and against K steps simulated."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator import steps as steps_module
from pipesched.simulator.api import simulate
from pipesched.simulator.cost_file import from_dict, to_dict
from pipesched.simulator.costs import CostModel, GradientSum, HostOverhead, Link, Network, StageCost
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.shared_grads import SharedSums, SumGroup, shared_sums, sum_groups
from pipesched.simulator.steps import step_matrix, steady_period
from pipesched.simulator.timing import resolve
from pipesched.simulator.trace import COMPUTE, OPTIMIZER, SPAN_OPS

NEG = -math.inf


def test_groups_are_the_ranks_holding_the_same_model_stages():
    grads = [StageCost(weight_grad_bytes=b) for b in (10.0, 20.0, 40.0, 80.0)]
    # DualPipe holds model stage k on ranks k and p-1-k: ranks 0 and 3 sum stages 0 and 3
    assert sum_groups(build("dualpipe", 4, 8), grads) == [SumGroup((0, 3), 90.0), SumGroup((1, 2), 60.0)]
    assert sum_groups(build("dualpipe", 2, 4), grads[:2]) == [SumGroup((0, 1), 30.0)]
    # the bytes default to the parameter bytes, as the all-reduces' do
    assert sum_groups(build("dualpipe", 2, 4), [StageCost(param_bytes=7.0)] * 2) == [SumGroup((0, 1), 14.0)]
    eight = [StageCost()] * 8
    for name, v in (("1f1b", 1), ("zb-v", 2), ("dualpipev", 2), ("interleaved-1f1b", 2)):
        schedule = build(name, 4, 8, v)
        assert sum_groups(schedule, eight[:schedule.num_model_stages]) == []
        assert shared_sums(schedule, eight[:schedule.num_model_stages], Network(), HostOverhead()) is None


def test_the_executor_sums_over_the_same_groups():
    replicas = pytest.importorskip("pipesched.executor.replicas")
    for p in (2, 4, 6):
        schedule = build("dualpipe", p, 2 * p)
        ours = {g.ranks for g in sum_groups(schedule, [StageCost()] * schedule.num_model_stages)}
        theirs = {tuple(r) for r in replicas.holders(schedule).values() if len(r) > 1}
        assert ours == theirs


def test_the_sum_by_hand():
    # one group of three led by rank 0, message 0.5 + 1e6 / 1e6 = 1.5 s; rank 3 sums nothing
    host = HostOverhead(per_send=0.1, send_start=0.04, per_recv=0.02, per_take=0.03)
    sums = SharedSums((SumGroup((0, 1, 2), 1e6),), Network(Link(0.5, 1e6)), host)
    ends = sums.ends(np.array([0.0, 2.0, 1.0, 7.0]))
    # members send at their ends: rank 1's arrives at 2 + 0.04 + 1.5 = 3.54, rank 2's at 2.54.
    # The leader takes rank 1's at max(0 + 0.02, 3.54) + 0.03 = 3.57, rank 2's at
    # max(3.57 + 0.02, 2.54) + 0.03 = 3.62, then sends the sum to rank 1 (arrives
    # 3.62 + 0.04 + 1.5 = 5.16) and to rank 2 (posted 0.1 later: arrives 5.26).
    # Rank 1 takes it at max(2 + 0.1 + 0.02, 5.16) + 0.03 = 5.19, rank 2 at 5.29;
    # the leader is done when its last send has arrived, 5.26.
    assert ends == pytest.approx([5.26, 5.19, 5.29, 7.0], abs=1e-12)


def test_a_rank_leading_one_group_and_member_of_another():
    # rank 1 first sends to rank 0 (it is a member there), then gathers rank 2's and
    # sends it the sum, then takes rank 0's sum; messages take 1 s, no host time
    sums = SharedSums((SumGroup((0, 1), 1.0), SumGroup((1, 2), 1.0)), Network(Link(1.0)), HostOverhead())
    ends = sums.ends(np.array([0.0, 0.0, 3.0]))
    # rank 1's message reaches rank 0 at 1, whose sum reaches rank 1 at 2; rank 2's reaches
    # rank 1 at 4, whose sum reaches rank 2 at 5; rank 1 takes rank 0's sum after that, at 4
    assert ends == pytest.approx([2.0, 5.0, 5.0])


def test_the_sum_is_max_plus_linear_and_keeps_unreached_ranks_unreached():
    host = HostOverhead(per_send=0.1, send_start=0.04, per_recv=0.02, per_take=0.03)
    sums = SharedSums((SumGroup((0, 3), 2e6), SumGroup((1, 2), 1e6)), Network(Link(0.5, 1e6)), host)
    rng = np.random.default_rng(7)
    x, shift = rng.uniform(0, 10, 4), 3.25
    assert sums.ends(x + shift) == pytest.approx(sums.ends(x) + shift)
    y = rng.uniform(0, 10, 4)
    assert sums.ends(np.maximum(x, y)) == pytest.approx(np.maximum(sums.ends(x), sums.ends(y)))
    assert sums.ends(np.array([0.0, NEG, NEG, NEG]))[[1, 2]].tolist() == [NEG, NEG]


def test_the_calibrated_sum_by_hand():
    # 2 ms + 1 ns a byte, the links and host times not used: a pair's 1e6 bytes take
    # 3 ms from its later member; the group of three (0, 2, 3) takes the per-byte part
    # twice, 2 + 2 x 2 = 6 ms. Ranks 0, 2 and 3 start the second group only once rank 0
    # is through the first: rank 0 leads both.
    host = HostOverhead(per_send=0.1, send_start=0.04, per_recv=0.02, per_take=0.03)
    sums = SharedSums((SumGroup((0, 1), 1e6), SumGroup((0, 2, 3), 2e6)), Network(Link(0.5, 1e6)), host,
                      GradientSum(fixed=2e-3, per_byte=1e-9))
    ends = sums.ends(np.array([1.0, 1.5, 1.7, 0.2, 9.0]))
    # pair: max(1.0, 1.5) + 0.003 = 1.503 on ranks 0 and 1; then max(1.503, 1.7, 0.2) + 0.006
    assert ends == pytest.approx([1.706, 1.503, 1.706, 1.706, 9.0], abs=1e-12)
    rng = np.random.default_rng(3)  # max-plus linear, unreached groups stay unreached
    x, y = rng.uniform(0, 10, 5), rng.uniform(0, 10, 5)
    assert sums.ends(x + 2.5) == pytest.approx(sums.ends(x) + 2.5)
    assert sums.ends(np.maximum(x, y)) == pytest.approx(np.maximum(sums.ends(x), sums.ends(y)))
    assert sums.ends(np.array([NEG, NEG, NEG, NEG, 1.0])).tolist() == [NEG, NEG, NEG, NEG, 1.0]


# --- in the steps -------------------------------------------------------------------------

N_BYTES = 3e6       # weight-gradient bytes per model stage
BANDWIDTH = 1e7     # bytes per second; no latency, and activations of no bytes: the pipeline's transfers take 0 s


def dualpipe_costs(**extra) -> CostModel:
    return CostModel(stages=(StageCost(1.0, 1.0, 1.0, param_bytes=N_BYTES, **extra),),
                     network=Network(Link(0.0, BANDWIDTH)))


def test_dualpipe_period_by_hand():
    # DualPipe, p = 2, m = 4, F = B = W = 1 s, transfers free. Rank 0 runs F0@0 [0,1],
    # F2@3 [1,2] (after rank 1's F2@2 [0,1]), F1@0 [2,3], BW2@3 [3,5], the pair
    # F3@3 + BW0@0 [5,8] (BW0@0 after rank 1's BW0@1 [3,5]), BW3@3 [8,10], B1@0 [10,11]
    # (after rank 1's BW1@1 [8,10]) and W1@0 [11,12]; rank 1 mirrors it: both end at 12.
    # Both ranks hold both model stages, so they sum 2 x 3 MB: rank 1's gradients reach
    # rank 0 at 12 + 0.6, the sum reaches rank 1 at 12 + 1.2. The ranks start every step
    # together, barrier or not: 13.2 s a step.
    graph = validate(build("dualpipe", 2, 4))
    costs = dualpipe_costs()
    assert compute_metrics(simulate(graph, costs)).makespan == pytest.approx(12.0)  # no span for the sum
    assert steady_period(graph, costs, "none") == pytest.approx(13.2, rel=1e-12)
    assert steady_period(graph, costs, "all") == pytest.approx(13.2, rel=1e-12)
    for barrier in ("all", "none"):
        for engine in ("exact", "des"):
            info = simulate(graph, costs, engine=engine, steps=5, step_barrier=barrier).meta["steps"]
            assert info["period"] == pytest.approx(13.2, rel=1e-12)
            assert info["ends"] == pytest.approx([13.2 * (k + 1) for k in range(5)], rel=1e-12)
            assert info["starts"] == pytest.approx([13.2 * k for k in range(5)], rel=1e-12)


def test_dualpipe_period_by_hand_with_the_calibrated_sum():
    # as above, the sum calibrated at 0.3 s + 50 ns a byte: 0.3 + 6e6 x 5e-8 = 0.6 s after
    # both ranks' 12 s, whatever the link; the cost file keeps it
    graph = validate(build("dualpipe", 2, 4))
    costs = dualpipe_costs()
    calibrated = CostModel(stages=costs.stages, network=costs.network, gradient_sum=GradientSum(0.3, 5e-8))
    assert from_dict(to_dict(calibrated)) == calibrated
    assert steady_period(graph, calibrated, "none") == pytest.approx(12.6, rel=1e-12)
    info = simulate(graph, calibrated, steps=4, step_barrier="none").meta["steps"]
    assert info["period"] == pytest.approx(12.6, rel=1e-12)
    assert info["ends"] == pytest.approx([12.6 * (k + 1) for k in range(4)], rel=1e-12)


def test_the_optimizer_steps_follow_the_sum():
    # as above with a 0.5 s optimizer step per model stage: each rank steps both after
    # the sum, 13.2 .. 13.7 .. 14.2, and the next step starts at 14.2
    graph = validate(build("dualpipe", 2, 4))
    costs = dualpipe_costs(optimizer_time=0.5)
    trace = simulate(graph, costs, steps=3, step_barrier="none")
    opt = (trace.lane == COMPUTE) & (trace.op == SPAN_OPS.index(OPTIMIZER))
    first = opt & (trace.start < 14.2)
    assert sorted(trace.start[first].tolist()) == pytest.approx([13.2, 13.2, 13.7, 13.7])
    assert trace.meta["steps"]["period"] == pytest.approx(14.2, rel=1e-12)
    assert trace.meta["steps"]["ends"] == pytest.approx([14.2, 28.4, 42.6], rel=1e-12)


def _columns_without_sums(graph, costs, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as patch:
        patch.setattr(steps_module, "step_sums", lambda *args: None)
        return step_matrix(graph, resolve(graph, costs), costs).a


@pytest.mark.parametrize("latency", [0.0, 0.3])
def test_the_sum_couples_the_groups_rows_of_the_step_matrix(monkeypatch, latency):
    # p = 4: ranks 0 and 3 sum (leader 0), ranks 1 and 2 (leader 1). Without host time a
    # group's ranks both end at max(leader's end, member's end + T) + T, T the message's
    # seconds; the links' rows keep what the pipeline gives them.
    costs = CostModel(stages=(StageCost(1.0, 1.2, 0.8, param_bytes=N_BYTES, activation_bytes=1e5),),
                      network=Network(Link(latency, BANDWIDTH)))
    graph = validate(build("dualpipe", 4, 8))
    before = _columns_without_sums(graph, costs, monkeypatch)
    matrix = step_matrix(graph, resolve(graph, costs), costs)
    after = matrix.a
    t = latency + 2 * N_BYTES / BANDWIDTH  # each group sums two model stages' gradients
    for leader, member in ((0, 3), (1, 2)):
        both = np.maximum(before[leader], before[member] + t) + t
        assert after[leader] == pytest.approx(both, rel=1e-12)
        assert after[member] == pytest.approx(both, rel=1e-12)
    assert np.array_equal(after[4:], before[4:])
    # the period of K steps simulated converges to the max cycle mean of the coupled matrix
    info = simulate(graph, costs, steps=30, step_barrier="none").meta["steps"]
    assert info["period"] == pytest.approx(matrix.period(), rel=1e-12)
    ends = info["ends"]
    assert any(math.isclose(ends[-1] - ends[-1 - c], c * info["period"], rel_tol=1e-9) for c in range(1, 9))
    # and the sums cost time the matrix without them does not have
    assert matrix.period() > steps_module.max_cycle_mean(before) + t


def test_the_calibrated_sum_couples_the_groups_rows_from_their_later_end(monkeypatch):
    # with the calibrated sum a group's ranks both end at max(leader's end, member's end) + T,
    # T = fixed + per_byte x the group's bytes (two model stages each)
    calibrated = GradientSum(fixed=0.05, per_byte=2e-8)
    costs = CostModel(stages=(StageCost(1.0, 1.2, 0.8, param_bytes=N_BYTES, activation_bytes=1e5),),
                      network=Network(Link(0.3, BANDWIDTH)), gradient_sum=calibrated)
    graph = validate(build("dualpipe", 4, 8))
    before = _columns_without_sums(graph, costs, monkeypatch)
    after = step_matrix(graph, resolve(graph, costs), costs).a
    t = 0.05 + 2e-8 * 2 * N_BYTES
    for leader, member in ((0, 3), (1, 2)):
        both = np.maximum(before[leader], before[member]) + t
        assert after[leader] == pytest.approx(both, rel=1e-12)
        assert after[member] == pytest.approx(both, rel=1e-12)
    assert np.array_equal(after[4:], before[4:])


def test_validation_keeps_the_gradient_bytes_it_strips_from_memory():
    validation = pytest.importorskip("pipesched.executor.validation")
    costs = CostModel(stages=(StageCost(param_bytes=5e5),), model_stages=(StageCost(param_bytes=3e5),
                                                                         StageCost(param_bytes=2e5)))
    stripped = validation.without_parameters(costs)
    assert [s.param_bytes for s in (*stripped.stages, *stripped.model_stages)] == [0.0, 0.0, 0.0]
    assert [s.synced_bytes for s in (*stripped.stages, *stripped.model_stages)] == [5e5, 3e5, 2e5]
