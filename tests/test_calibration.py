"""Calibration without a process group: profiling one stage module, fitting a link,
deciding when ranks share the host, and the cost model it assembles."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pipesched.executor.calibrate import host_sharing, oversubscribed, side_by_side_groups  # noqa: E402
from pipesched.executor.links import fit_link  # noqa: E402
from pipesched.executor.profile import profile_stage, slowdown  # noqa: E402
from pipesched.executor.clock import now  # noqa: E402
from pipesched.executor.memory import MemoryLedger  # noqa: E402
from pipesched.executor.models import ExampleModel, check_model, mse_loss  # noqa: E402
from pipesched.executor.stage import StageModule  # noqa: E402
from pipesched.executor.validation import without_parameters  # noqa: E402
from pipesched.simulator.costs import uniform  # noqa: E402


def test_a_line_through_exact_points_gives_its_latency_and_bandwidth():
    sizes = [1_000, 100_000, 1_000_000]
    latency, bandwidth = fit_link(sizes, [20e-6 + n / 5e9 for n in sizes])
    assert latency == pytest.approx(20e-6, rel=1e-6) and bandwidth == pytest.approx(5e9, rel=1e-6)
    latency, bandwidth = fit_link(sizes, [30e-6, 29e-6, 28e-6])  # falling: no bandwidth limit seen
    assert math.isinf(bandwidth) and latency > 0


def _profile(model: ExampleModel, k: int, stages: int):
    built = model.build(stages, 1)
    specs = check_model(built, stages, 1)
    module = built.stages[k]
    sm = StageModule(module, k, stages, mse_loss, 1.0, MemoryLedger(now, list(module.parameters())))
    x = built.inputs[0] if k == 0 else torch.randn(specs[k - 1].shape, dtype=specs[k - 1].dtype)
    grad = None if k == stages - 1 else torch.randn(specs[k].shape, dtype=specs[k].dtype)
    target = built.targets[0] if k == stages - 1 else None
    return profile_stage(sm, x, target, grad, torch.device("cpu"), repeats=5, warmup=1), module, specs


@pytest.mark.parametrize("k", [0, 1, 2])
def test_profiling_a_stage_times_every_op_and_counts_what_it_saves(k):
    model = ExampleModel("mlp", hidden=64, layers_per_stage=2, microbatch_size=16)
    prof, module, specs = _profile(model, k, 3)
    assert len(prof.samples["F"]) == 20 and len(prof.samples["BW"]) == len(prof.samples["BW first"]) == 5
    assert prof.grad_accumulate >= 0 and 0 < prof.bookkeeping < prof.forward
    assert all(t > 0 for t in (prof.forward, prof.backward_weight, prof.backward_full))
    # each block saves fc1's input (16x64), fc1's output for gelu (16x256) and gelu's output for fc2 (16x256);
    # the last stage's loss also saves the output and the target (16x64 each)
    loss = 2 * 16 * 64 * 4 if k == 2 else 0
    assert prof.activation_memory == 2 * 4 * 16 * (64 + 256 + 256) + loss
    # B keeps what W needs (fc inputs, gelu outputs) and the gradients it captured at each Linear for W
    assert prof.weight_memory > 0
    assert prof.param_bytes == 4 * sum(p.numel() for p in module.parameters())
    assert all(p.grad is None or p.grad.abs().sum() > 0 for p in module.parameters())
    assert specs[k].nbytes == 16 * 64 * 4


def test_the_first_stage_input_backward_is_nearly_free():
    # model stage 0's input needs no gradient: its B has almost nothing to do, W everything
    prof, _, _ = _profile(ExampleModel("mlp", hidden=128, layers_per_stage=2, microbatch_size=32), 0, 2)
    assert prof.backward_input < 0.25 * prof.backward_weight


def test_ranks_share_the_host_when_their_threads_exceed_the_cores_or_slow_each_other():
    shared = host_sharing("gloo", cores=2, threads=1, ranks=4, hosts=["h"] * 4)
    assert shared is not None and shared.capacity == 2 and shared.compute_demand == 1 and shared.wait_demand == 0
    assert oversubscribed(shared, 4)
    assert host_sharing("gloo", cores=2, threads=1, ranks=2, hosts=["h"] * 2) is None
    side_by_side = host_sharing("gloo", cores=2, threads=1, ranks=2, hosts=["h"] * 2, interference=0.1)
    assert side_by_side.interference == 0.1 and not oversubscribed(side_by_side, 2)
    assert host_sharing("gloo", 2, 1, 4, ["a", "a", "b", "b"]) is None  # several hosts: not modelled as one
    assert host_sharing("nccl", 2, 1, 4, ["h"] * 4) is None


def test_side_by_side_profiling_groups_fill_the_cores():
    assert side_by_side_groups(4, cores=2, threads=1) == [[0, 1], [2, 3]]
    assert side_by_side_groups(3, cores=2, threads=1) == [[0, 1]]  # a rank alone measures nothing
    assert side_by_side_groups(2, cores=2, threads=2) == []
    assert side_by_side_groups(2, cores=16, threads=8) == [[0, 1]]


def test_slowdown_compares_the_ops_side_by_side_with_alone():
    alone, _, _ = _profile(ExampleModel("mlp", hidden=64, layers_per_stage=1, microbatch_size=8), 1, 3)
    from dataclasses import replace
    slower = replace(alone, forward=alone.forward * 1.5, backward_input=alone.backward_input * 1.5,
                     backward_weight=alone.backward_weight * 1.5, backward_full=alone.backward_full * 1.5)
    assert slowdown(alone, slower) == pytest.approx(0.5)


def test_the_compared_prediction_leaves_parameters_out():
    costs = uniform(1, 1, 1, param_bytes=100, activation_memory=5)
    stripped = without_parameters(costs)
    assert stripped.stages[0].param_bytes == 0 and stripped.stages[0].activation_memory == 5


@pytest.mark.parametrize("k", [0, 2])
def test_the_stage_switch_measurement_leaves_the_stage_as_it_found_it(k):
    from pipesched.executor.profile import stage_for_profiling, switch_slowdown

    model = ExampleModel("mlp", hidden=64, layers_per_stage=2, microbatch_size=16)
    built = model.build(3, 2)
    sm, x, target, grad = stage_for_profiling(built, check_model(built, 3, 2), k, torch.device("cpu"))
    fractions = switch_slowdown(sm, x, target, grad, repeats=3, warmup=1)
    assert len(fractions) == 4 and all(math.isfinite(f) and f >= 0 for f in fractions)
    assert all(p.grad is None for p in sm.params)
    assert sm.ledger.current == 0  # every F it ran was taken back by its backward


def test_the_gradient_sum_fit_is_least_squares_with_no_term_below_zero():
    from pipesched.executor.sum_timing import fit_gradient_sum, pair_medians
    # exact points on 2 ms + 3 ns/byte
    fixed, per_byte = fit_gradient_sum({4096: 2e-3 + 4096 * 3e-9, 10**7: 2e-3 + 3e-2, 2 * 10**7: 2e-3 + 6e-2})
    assert fixed == pytest.approx(2e-3, rel=1e-9) and per_byte == pytest.approx(3e-9, rel=1e-9)
    # points growing faster than a line: the free line crosses 0 s above 0 bytes, so the
    # fit is the best line through the origin: sum(n t) / sum(n n) = (1 * 1 + 2 * 4) / (1 + 4)
    assert fit_gradient_sum({0: 0.0, 1: 1.0, 2: 4.0}) == pytest.approx((0.0, 9 / 5))
    assert fit_gradient_sum({1: 3.0, 2: 1.0}) == pytest.approx((2.0, 0.0))  # falling: the mean, fixed
    assert fit_gradient_sum({1: 3.0}) is None
    # a repeat takes the later rank; the median over repeats
    assert pair_medians([{8: [1.0, 5.0, 2.0]}, {8: [3.0, 1.0, 1.0]}]) == {8: 3.0}


def test_the_gradient_sum_is_timed_on_one_and_two_stages_of_parameters():
    from pipesched.executor import sum_timing
    built = ExampleModel("mlp", hidden=16, layers_per_stage=(1, 2)).build(2, 1)
    shapes = sum_timing.stage_shapes(built.stages)  # the bigger stage's parameters
    assert shapes == [(tuple(p.shape), p.dtype) for p in built.stages[1].parameters()]
    small, once, twice = sum_timing.payloads(shapes)
    assert small == [((sum_timing.SUM_SMALL_BYTES // 4,), torch.float32)] and once == shapes
    assert twice == shapes * 2
    huge = [((sum_timing.SUM_MAX_BYTES // 4,), torch.float32)]  # twice would exceed the cap: flat, capped
    assert [sum(n for (n,), _ in p) * 4 for p in sum_timing.payloads(huge)[1:]] == \
        [sum_timing.SUM_MAX_BYTES // 2, sum_timing.SUM_MAX_BYTES]
    assert sum_timing.time_gradient_sum(0, 1, shapes, torch.device("cpu"), 10.0) == {}  # one rank: nothing
