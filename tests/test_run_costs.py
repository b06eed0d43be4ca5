"""Op times read from runs (simulator.run_costs) and the calibration runs they come from."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import (CostError, CostModel, DataParallel, FixedOpTimes, HostOverhead, HostSharing,
                                       Link, Network, StageCost, StageSwitch)
from pipesched.simulator.dedicated import dedicated_durations
from pipesched.simulator.exact import longest_path
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.replay import task_spans
from pipesched.simulator.timing import resolve, to_trace
from pipesched.simulator.trace import Trace
from pipesched.simulator.run_costs import costs_from_runs, op_time_samples, relative_iqr, step_residual
from pipesched.simulator.trace import COMPUTE

from helpers import run_with_receive_takes

SOLO = CostModel(stages=(StageCost(1.0, 1.0, 1.0),),
                 model_stages=(StageCost(1.0, 1.0, 2.0, backward_full=2.7, activation_bytes=8.0),
                               StageCost(2.0, 2.0, 2.0, backward_full=3.6, activation_bytes=8.0)),
                 host=HostSharing(capacity=2, interference=0.3))


def run_of(name: str, truth: CostModel):
    """A 'measured' run: the simulation of `name` under `truth`, without host sharing."""
    schedule = build(name, 2, 4)
    return schedule, simulate(schedule, replace(truth, host=None))


def test_op_times_are_the_runs_means_and_sharing_is_not_applied_again():
    truth = replace(SOLO, model_stages=(StageCost(1.5, 1.25, 2.5, backward_full=3.5, activation_bytes=8.0),
                                        StageCost(2.5, 2.25, 2.75, backward_full=4.5, activation_bytes=8.0)))
    got = costs_from_runs(SOLO, [run_of("1f1b", truth), run_of("zb-h1", truth)])
    assert [(s.forward, s.backward_input, s.backward_weight, s.backward_full) for s in got.model_stages] == \
        [(1.5, 1.25, 2.5, 3.5), (2.5, 2.25, 2.75, 4.5)]
    assert got.host is None and got.model_stages[0].activation_bytes == 8.0  # the rest as calibrated
    assert got.meta["from_runs"]["schedules"] == ["1f1b", "zb-h1"] and got.meta["from_runs"]["spread"] == 0.0


def test_host_time_is_fitted_to_every_runs_gaps_when_asked(monkeypatch):
    import pipesched.simulator.replay as replay_module

    monkeypatch.setattr(replay_module, "WAIT_MARGIN", 0.0)  # a simulated run's waits are exact
    truth = HostOverhead(per_op=40e-6, per_send=250e-6, per_recv=120e-6, per_take=30e-6)
    ran = replace(SOLO, host=None, host_overhead=truth, recv_lookahead=1,
                  network=Network(Link(latency=50e-6, bandwidth=1e9)))
    runs = [(schedule, run_with_receive_takes(schedule, ran)[1])
            for schedule in (build("1f1b", 2, 4), build("zb-h1", 2, 4))]
    calibrated = replace(SOLO, host_overhead=HostOverhead(per_op=1e-6))
    got = costs_from_runs(calibrated, runs, host_time=True, residual=False).host_overhead
    for name in ("per_op", "per_send", "per_recv", "per_take"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert costs_from_runs(calibrated, runs, residual=False).host_overhead == calibrated.host_overhead  # by default


def test_an_op_kind_no_run_executed_is_scaled_by_the_solo_ratio():
    truth = replace(SOLO, model_stages=tuple(replace(s, forward=2 * s.forward, backward_input=2 * s.backward_input,
                                                     backward_weight=2 * s.backward_weight,
                                                     backward_full=2 * s.backward_full) for s in SOLO.model_stages))
    only_fused = costs_from_runs(SOLO, [run_of("1f1b", truth)])  # BW measured: B and W split as profiled
    assert only_fused.model_stages[0].backward_full == pytest.approx(5.4)
    assert only_fused.model_stages[0].backward_input == pytest.approx(5.4 / 3)
    assert only_fused.model_stages[0].backward_weight == pytest.approx(5.4 * 2 / 3)
    only_split = costs_from_runs(SOLO, [run_of("zb-h1", truth)])  # B, W measured: BW as B + W times 2.7/3
    assert only_split.model_stages[0].backward_full == pytest.approx(6.0 * 2.7 / 3)


def test_the_spread_of_the_samples_is_reported():
    schedule, trace = run_of("1f1b", SOLO)
    noisy = replace(trace, end=trace.end.copy())
    f_stage0 = np.flatnonzero((trace.lane == COMPUTE) & (trace.op == 0) & (trace.stage == 0))
    noisy.end[f_stage0] += np.array([0.0, 0.5, 1.0, 1.5])  # F: 1, 1.5, 2, 2.5 s: IQR 0.75 s, median 1.75 s
    got = costs_from_runs(SOLO, [(schedule, noisy)], residual=False)
    assert got.model_stages[0].forward == pytest.approx(1.75)
    assert got.meta["from_runs"]["spread"] == pytest.approx(0.75 / 1.75)


def test_a_two_humped_op_counts_both_humps():
    """Ops 1x or 2x as a shared core's other rank waits or computes: the mean, not the median."""
    schedule, trace = run_of("1f1b", SOLO)
    humps = replace(trace, end=trace.end.copy())
    f_stage0 = np.flatnonzero((trace.lane == COMPUTE) & (trace.op == 0) & (trace.stage == 0))
    humps.end[f_stage0] += np.array([0.0, 0.0, 0.0, 1.0])  # F: 1, 1, 1, 2 s: median 1 s, mean 1.25 s
    assert costs_from_runs(SOLO, [(schedule, humps)], residual=False).model_stages[0].forward == pytest.approx(1.25)


def test_relative_iqr_ignores_a_single_outlier_and_the_number_of_samples():
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)
    assert relative_iqr([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0] * 20) == pytest.approx(2.0 / 3.0)


def test_runs_of_another_split_alone_or_of_a_third_split_or_without_model_stages_are_refused():
    zbv = build("zb-v", 2, 4)
    with pytest.raises(CostError, match="no run splits the model into the calibration's 2 model stages"):
        costs_from_runs(SOLO, [(zbv, simulate(zbv, replace(SOLO, host=None)))])
    thirds = build("interleaved-1f1b", 2, 4, 3)
    with pytest.raises(CostError, match="6 model stages, the calibration 2"):
        costs_from_runs(SOLO, [run_of("1f1b", SOLO), (thirds, simulate(thirds, replace(SOLO, host=None)))])
    with pytest.raises(CostError, match="need a calibration with model_stages"):
        costs_from_runs(replace(SOLO, model_stages=None), [run_of("1f1b", SOLO)])


def test_samples_are_keyed_by_op_and_model_stage():
    schedule, trace = run_of("zb-h1", SOLO)
    samples = op_time_samples(schedule, trace)
    assert sorted(samples) == [("B", 0), ("B", 1), ("F", 0), ("F", 1), ("W", 0), ("W", 1)]
    assert all(len(v) == 4 for v in samples.values())


def test_calibration_runs_match_the_split():
    pytest.importorskip("torch")
    from pipesched.executor.run_calibration import calibration_runs

    assert [s.name for s in calibration_runs(build("zb-h2", 2, 4))] == ["1f1b", "zb-h1"]
    assert [s.name for s in calibration_runs(build("dualpipev", 2, 4))] == ["interleaved-1f1b", "zb-v"]
    assert all(s.num_model_stages == 4 for s in calibration_runs(build("dualpipev", 2, 4)))


def test_the_run_at_the_other_split_runs_the_same_network():
    pytest.importorskip("torch")
    from pipesched.executor.models import ExampleModel
    from pipesched.executor.run_calibration import other_split_run, resplit_blocks

    assert resplit_blocks(4, 2, 4) == 2 and resplit_blocks(2, 4, 2) == 4
    assert resplit_blocks((3, 1), 2, 3) is None  # neither twice nor half as many
    assert resplit_blocks((2, 4), 2, 4) == (1, 1, 2, 2) and resplit_blocks((1, 1, 2, 2), 4, 2) == (2, 4)
    assert resplit_blocks((3, 2), 2, 4) is None  # 3 blocks do not halve
    run, model = other_split_run(build("zb-h2", 2, 4), ExampleModel(layers_per_stage=2))
    assert (run.name, run.num_model_stages, model.layers_per_stage) == ("zb-v", 4, 1)
    run, model = other_split_run(build("dualpipev", 2, 4), ExampleModel(layers_per_stage=2))
    assert (run.name, run.num_model_stages, model.layers_per_stage) == ("zb-h1", 2, 4)
    assert other_split_run(build("1f1b", 2, 4), ExampleModel(layers_per_stage=3)) is None
    assert other_split_run(build("1f1b", 2, 4), object()) is None  # a model that cannot be split again


def test_a_step_that_stalls_does_not_move_the_op_times():
    """Per op kind: each step's mean, then the median over steps."""
    schedule, trace = run_of("1f1b", SOLO)
    stalled = replace(trace, end=trace.end.copy())
    f_stage0 = np.flatnonzero((trace.lane == COMPUTE) & (trace.op == 0) & (trace.stage == 0))
    stalled.end[f_stage0[0]] += 100.0
    got = costs_from_runs(SOLO, [(schedule, trace), (schedule, stalled), (schedule, trace)])
    assert got.model_stages[0].forward == pytest.approx(1.0)


TRUTH = replace(SOLO, host=None, model_stages=(StageCost(2.0, 1.0, 3.0, backward_full=3.5, activation_bytes=8.0),
                                               StageCost(2.5, 2.25, 2.75, backward_full=4.5, activation_bytes=8.0)),
                fixed_op_times=FixedOpTimes(forward=0.2, backward_input=0.3, backward_weight=0.1, backward_full=0.3))


def test_runs_at_two_splits_give_each_op_kinds_fixed_time_and_predict_the_other_split_exactly():
    runs = [run_of(name, TRUTH) for name in ("1f1b", "zb-h1", "zb-v")]
    got = costs_from_runs(SOLO, runs)
    assert got.fixed_op_times.forward == pytest.approx(0.2)
    assert got.fixed_op_times.backward_input == pytest.approx(0.3)
    assert got.fixed_op_times.backward_weight == pytest.approx(0.1)
    assert got.fixed_op_times.backward_full == pytest.approx(0.3)  # not measured both ways: max(B, W)
    # a half of model stage 1: F (2.5 - 0.2) / 2 + 0.2, not 2.5 / 2
    assert got.model_stage_costs(2, 4)[3].forward == pytest.approx(1.35)
    for name in ("interleaved-1f1b", "dualpipev", "looped-bfs"):
        schedule = build(name, 2, 4)
        want = compute_metrics(simulate(schedule, TRUTH)).makespan
        assert compute_metrics(simulate(schedule, got)).makespan == pytest.approx(want, rel=1e-9), name
    # one split only: the halves are plain halves, and v = 2 is predicted short
    one = costs_from_runs(SOLO, runs[:2])
    assert not one.fixed_op_times.any
    assert compute_metrics(simulate(build("interleaved-1f1b", 2, 4), one)).makespan < \
        compute_metrics(simulate(build("interleaved-1f1b", 2, 4), TRUTH)).makespan


def test_a_coarser_run_gives_the_fixed_time_of_a_v2_calibration():
    fine = replace(SOLO, model_stages=tuple(TRUTH.model_stage_costs(2, 4)), fixed_op_times=FixedOpTimes())
    runs = [run_of(name, TRUTH) for name in ("interleaved-1f1b", "zb-v", "zb-h1")]
    got = costs_from_runs(fine, runs)
    assert got.fixed_op_times.forward == pytest.approx(0.2)
    assert compute_metrics(simulate(build("1f1b", 2, 4), got)).makespan == \
        pytest.approx(compute_metrics(simulate(build("1f1b", 2, 4), TRUTH)).makespan, rel=1e-9)


def test_fixed_op_times_round_trip_through_a_cost_file():
    from pipesched.simulator.cost_file import from_dict, to_dict

    doc = to_dict(TRUTH)
    assert doc["fixed_op_times"]["backward_input"] == 0.3
    assert from_dict(doc).fixed_op_times == TRUTH.fixed_op_times
    assert from_dict({**doc, "fixed_op_times": {"forward": "2ms"}}).fixed_op_times.forward == pytest.approx(2e-3)
    with pytest.raises(CostError, match="fixed_op_times"):
        from_dict({**doc, "fixed_op_times": {"forward": -1.0}})
    with pytest.raises(CostError, match="fixed_op_times"):
        from_dict({**doc, "fixed_op_times": {"fwd": 1.0}})


SHARED = HostSharing(capacity=2, pinned=True, switching=0.0)


def _trace(spans):
    return Trace.from_spans("hand", 4, 1, "measured", [(r, COMPUTE, "F", 0, r, a, b) for r, a, b in spans])


def test_dedicated_work_undoes_processor_sharing_with_the_cores_other_ranks():
    # ranks 0 and 2 share core 0: rank 0 computes 0-4 s, rank 2 2-4 s: 2 s alone, 2 s at half speed
    trace = _trace([(0, 0.0, 4.0), (2, 2.0, 4.0), (1, 0.0, 4.0)])
    assert list(dedicated_durations(trace, SHARED)) == pytest.approx([3.0, 1.0, 4.0])
    slower = dedicated_durations(trace, replace(SHARED, switching=0.5))  # 1 / (2 x 1.5) while shared
    assert list(slower) == pytest.approx([2.0 + 2.0 / 3.0, 2.0 / 3.0, 4.0])
    assert list(dedicated_durations(trace, HostSharing(capacity=4, pinned=True))) == [4.0, 2.0, 4.0]


def test_a_data_parallel_runs_other_replicas_share_replica_0s_cores():
    # p = 2, d = 2 on 2 cores: global rank 2 (replica 1's stage 0) shares core 0 with rank 0
    trace = Trace.from_spans("hand", 2, 1, "measured", [(0, COMPUTE, "F", 0, 0, 0.0, 4.0), (1, COMPUTE, "F", 0, 1, 0.0, 2.0)],
                             meta={"data_parallel": {"degree": 2}, "replica_compute": [[2, 2.0, 4.0], [3, 0.0, 1.0]]})
    assert list(dedicated_durations(trace, SHARED)) == pytest.approx([3.0, 1.5])
    alone = replace(trace, meta={})  # without the other replicas' spans: two ranks, two cores, nothing shared
    assert list(dedicated_durations(alone, SHARED)) == [4.0, 2.0]


def test_runs_on_shared_cores_are_read_as_dedicated_work_and_shared_again():
    host = HostSharing(capacity=2, pinned=True, switching=0.1, host_time_first=True)
    truth = replace(SOLO, host=host, host_overhead=HostOverhead(per_op=1e-3, per_send=5e-3),
                    model_stages=tuple(replace(s, activation_bytes=8.0) for s in TRUTH.model_stage_costs(4, 4)))
    base = replace(truth, model_stages=tuple(replace(s, forward=1.0) for s in truth.model_stages))

    def ran(name):
        schedule = build(name, 4, 8)
        return schedule, simulate(schedule, truth, engine="des")

    got = costs_from_runs(base, [ran("1f1b"), ran("zb-h1")], host_time=True, sharing=replace(host, host_time_first=False),
                          residual=False)
    assert got.host == host and got.host_overhead == truth.host_overhead  # host time as profiled
    assert got.meta["from_runs"]["dedicated"]
    for mine, want in zip(got.model_stages, truth.model_stages):
        assert (mine.forward, mine.backward_input, mine.backward_weight) == \
            pytest.approx((want.forward, want.backward_input, want.backward_weight), rel=1e-6)
    dualpipe = build("dualpipe", 4, 8)
    assert compute_metrics(simulate(dualpipe, got)).makespan == \
        pytest.approx(compute_metrics(simulate(dualpipe, truth)).makespan, rel=1e-6)
    # read as plain durations, the same runs predict another schedule differently
    plain = costs_from_runs(base, [ran("1f1b"), ran("zb-h1")])
    assert plain.host is None and plain.model_stages[1].forward > truth.model_stages[1].forward


def test_host_time_first_runs_host_time_beside_a_core_mates_op_at_full_speed():
    # ranks 0 and 2 share core 0 (4 ranks, 2 cores); host time after every op
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),), host_overhead=HostOverhead(per_op=0.5),
                      host=HostSharing(capacity=2, pinned=True))
    schedule = build("gpipe", 4, 4)

    def makespan(host):
        return compute_metrics(simulate(schedule, replace(costs, host=host))).makespan

    assert makespan(replace(costs.host, host_time_first=True)) < makespan(costs.host)
    alone = HostSharing(capacity=4, pinned=True)  # a core each: nothing to run first
    assert makespan(replace(alone, host_time_first=True)) == makespan(alone)


def noisy_steps(name: str, truth: CostModel, steps: int, cv: float) -> list:
    """`steps` 'measured' steps of `name`: every op's time drawn around `truth`'s."""
    schedule = build(name, 2, 4)
    rng = np.random.default_rng(5)
    return [(schedule, simulate(schedule, replace(truth, host=None), noise_cv=cv, rng=rng)) for _ in range(steps)]


def test_the_step_residual_is_one_where_the_costs_predict_the_runs_exactly():
    got = costs_from_runs(SOLO, [run_of("1f1b", SOLO), run_of("zb-h1", SOLO)])
    assert got.meta["from_runs"]["residual"] == pytest.approx(1.0, abs=1e-12)
    assert got.model_stages[1].forward == pytest.approx(2.0, rel=1e-12)


def test_a_step_longer_than_its_own_op_times_sets_the_residual_and_scales_op_times():
    """The runtime between ops (here 0.2 s after each op) that the calibration does not
    hold makes every step longer than the same step over its own op times."""
    truth = replace(SOLO, host_overhead=HostOverhead(per_op=0.2))
    runs = [run_of("1f1b", truth), run_of("zb-h1", truth)]
    raw = costs_from_runs(SOLO, runs, residual=False)
    got = costs_from_runs(SOLO, runs)
    k = got.meta["from_runs"]["residual"]
    assert k == pytest.approx(step_residual(raw, runs)) and k > 1.05
    assert got.model_stages[0].backward_full == pytest.approx(k * raw.model_stages[0].backward_full)


def test_op_times_that_differ_between_the_runs_do_not_set_the_residual():
    """1F1B's forwards 20 % longer than ZB-H1's: the pooled forward fits neither run, but
    each run's steps are exactly its own op times, so nothing is left for the residual
    (held against the pooled op times it was 1.02 for 1F1B and 0.98 for ZB-H1)."""
    slow = replace(SOLO, model_stages=tuple(replace(s, forward=1.2 * s.forward) for s in SOLO.model_stages))
    runs = [run_of("1f1b", slow), run_of("zb-h1", SOLO)]
    got = costs_from_runs(SOLO, runs)
    assert got.model_stages[0].forward == pytest.approx(1.1)  # the two runs' forwards pooled
    assert got.meta["from_runs"]["residual"] == pytest.approx(1.0, abs=1e-12)


def test_noisy_steps_are_held_against_their_own_op_times_step_by_step():
    runs = noisy_steps("1f1b", SOLO, 9, 0.3) + noisy_steps("zb-h1", SOLO, 9, 0.3)
    raw = costs_from_runs(SOLO, runs, residual=False)
    graph = {name: validate(build(name, 2, 4)) for name in ("1f1b", "zb-h1")}

    def over_own_means(schedule, trace):
        g = graph[schedule.name]
        own = (trace.end - trace.start)[task_spans(g, trace)]
        col = g.columns()
        means = own.copy()
        for rank in range(2):
            for op in np.unique(col["op"]):
                for stage in range(2):
                    group = (col["rank"] == rank) & (col["op"] == op) & (col["stage"] == stage)
                    if group.any():
                        means[group] = own[group].mean()
        timing = resolve(g, raw, task_times=means)
        return compute_metrics(trace).makespan / compute_metrics(to_trace(g, timing, longest_path(g, timing), {})).makespan

    per_run = [np.median([over_own_means(s, t) for s, t in runs if s.name == name]) for name in ("1f1b", "zb-h1")]
    assert step_residual(raw, runs) == pytest.approx(np.sqrt(per_run[0] * per_run[1]), rel=1e-12)


def test_given_op_times_replace_the_cost_models_in_a_simulation():
    """`simulate(..., task_times=)`, what the residual and error_shares simulate a run's own
    op times with: 1F1B at p = 2, m = 4, every op 1 s and links free is 2 (m + p - 1) s."""
    graph = validate(build("1f1b", 2, 4))
    plain = CostModel(stages=(StageCost(5.0, 5.0, 5.0),))
    ones = np.ones(len(graph.columns()["op"]))
    assert compute_metrics(simulate(graph, plain, task_times=ones)).makespan == pytest.approx(10.0)
    assert compute_metrics(simulate(graph, plain)).makespan > 40.0


def test_each_first_backwards_kept_gradients_are_added_back_to_a_runs_means():
    """The first W or BW of a stage on a rank keeps its gradients and takes grad_accumulate
    less; a run's mean holds that saving once, and the simulation takes it off again: added
    back, the runs give back exactly the costs they were simulated with."""
    truth = replace(SOLO, model_stages=tuple(replace(s, grad_accumulate=0.4) for s in SOLO.model_stages))
    runs = [run_of("1f1b", truth), run_of("zb-h1", truth)]
    got = costs_from_runs(truth, runs)
    for mine, want in zip(got.model_stages, truth.model_stages):
        assert mine.backward_full == pytest.approx(want.backward_full, rel=1e-12)
        assert mine.backward_weight == pytest.approx(want.backward_weight, rel=1e-12)
    assert got.meta["from_runs"]["residual"] == pytest.approx(1.0, rel=1e-12)


def test_the_residual_counts_only_runs_with_the_costs_replicas_and_split():
    # steps 0.5 s longer per op than their op times (runtime the costs do not hold)
    schedule, trace = run_of("1f1b", replace(SOLO, host_overhead=HostOverhead(per_op=0.5)))
    dp = replace(trace, meta={**trace.meta, "data_parallel": {"degree": 2}})
    plain = replace(SOLO, host=None)
    assert step_residual(plain, [(schedule, dp)]) == 1.0  # a data-parallel step: not this pipeline's
    assert step_residual(plain, [(build("zb-v", 2, 4), trace)]) == 1.0  # another split
    assert step_residual(plain, [(schedule, trace)]) > 1.1


def test_the_residual_of_data_parallel_steps_takes_their_mean_not_their_median():
    schedule, trace = run_of("1f1b", SOLO)
    dp = {**trace.meta, "data_parallel": {"degree": 2}}
    steps = [replace(trace, start=trace.start * k, end=trace.end * k, meta=dp) for k in (1.0, 1.0, 1.0, 1.5, 1.6)]
    costs = replace(SOLO, host=None, data_parallel=DataParallel(2))  # no gradient bytes: the pipeline alone
    # median 1.0, mean 1.22: two of five steps in the slow mode move the residual
    assert step_residual(costs, [(schedule, t) for t in steps]) == pytest.approx(1.22)
    assert step_residual(replace(costs, data_parallel=DataParallel()),
                         [(schedule, replace(t, meta=trace.meta)) for t in steps]) == pytest.approx(1.0)


SWITCHING = replace(TRUTH, stage_switch=StageSwitch(forward=0.4, backward=0.2, forward_second=0.1,
                                                    backward_second=0.05))


def test_with_the_calibrations_stage_switch_every_schedule_is_predicted_exactly():
    """The switch lengthens DualPipe's ops (two replicas a rank at the calibration's split);
    v = 2 schedules keep the fixed times read from ZB-V's run, which hold it."""
    runs = [run_of(name, SWITCHING) for name in ("1f1b", "zb-h1", "zb-v")]
    got = costs_from_runs(replace(SOLO, stage_switch=SWITCHING.stage_switch), runs, residual=False)
    assert got.fixed_op_times.forward == pytest.approx(0.2)
    assert got.fixed_op_times.backward_input == pytest.approx(0.3)
    for name in ("interleaved-1f1b", "dualpipev", "looped-bfs", "dualpipe", "zb-v"):
        schedule = build(name, 2, 4)
        want = compute_metrics(simulate(schedule, SWITCHING)).makespan
        assert compute_metrics(simulate(schedule, got)).makespan == pytest.approx(want, rel=1e-9), name
    # without it, DualPipe is predicted short: runs of one stage per rank never switch
    blind = costs_from_runs(SOLO, runs, residual=False)
    dualpipe = build("dualpipe", 2, 4)
    assert compute_metrics(simulate(dualpipe, blind)).makespan < compute_metrics(simulate(dualpipe, SWITCHING)).makespan


def test_a_calibration_run_that_switches_stages_is_read_as_the_ops_own_time():
    truth = replace(SWITCHING, fixed_op_times=FixedOpTimes())
    schedule, trace = run_of("dualpipe", truth)
    got = costs_from_runs(replace(SOLO, stage_switch=truth.stage_switch), [(schedule, trace)], residual=False)
    assert [s.forward for s in got.model_stages] == pytest.approx([2.0, 2.5])


def test_each_calibration_runs_typical_step_is_kept_for_a_second_run_of_it():
    runs = [run_of(name, TRUTH) for name in ("1f1b", "zb-h1", "zb-v")]
    got = costs_from_runs(SOLO, runs, residual=False)
    typical = got.meta["from_runs"]["typical_steps"]
    assert set(typical) == {"1f1b", "zb-h1", "zb-v"}
    for schedule, trace in runs:
        assert typical[schedule.name] == pytest.approx([schedule.num_model_stages, compute_metrics(trace).makespan])
    # the median over a run's steps
    schedule, trace = runs[0]
    slow = replace(trace, end=trace.end * 1.5)
    steps = costs_from_runs(SOLO, [(schedule, trace), (schedule, slow), (schedule, trace)] + runs[1:],
                            residual=False).meta["from_runs"]["typical_steps"]
    assert steps["1f1b"] == pytest.approx([2, compute_metrics(trace).makespan])
