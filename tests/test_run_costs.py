"""Op times read from runs (simulator.run_costs) and the calibration runs they come from."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, CostModel, HostOverhead, HostSharing, Link, Network, StageCost
from pipesched.simulator.run_costs import costs_from_runs, op_time_samples, relative_iqr
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
    got = costs_from_runs(calibrated, runs, host_time=True).host_overhead
    for name in ("per_op", "per_send", "per_recv", "per_take"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert costs_from_runs(calibrated, runs).host_overhead == calibrated.host_overhead  # kept by default


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
    got = costs_from_runs(SOLO, [(schedule, noisy)])
    assert got.model_stages[0].forward == pytest.approx(1.75)
    assert got.meta["from_runs"]["spread"] == pytest.approx(0.75 / 1.75)


def test_a_two_humped_op_counts_both_humps():
    """Ops 1x or 2x as a shared core's other rank waits or computes: the mean, not the median."""
    schedule, trace = run_of("1f1b", SOLO)
    humps = replace(trace, end=trace.end.copy())
    f_stage0 = np.flatnonzero((trace.lane == COMPUTE) & (trace.op == 0) & (trace.stage == 0))
    humps.end[f_stage0] += np.array([0.0, 0.0, 0.0, 1.0])  # F: 1, 1, 1, 2 s: median 1 s, mean 1.25 s
    assert costs_from_runs(SOLO, [(schedule, humps)]).model_stages[0].forward == pytest.approx(1.25)


def test_relative_iqr_ignores_a_single_outlier_and_the_number_of_samples():
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)
    assert relative_iqr([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0] * 20) == pytest.approx(2.0 / 3.0)


def test_runs_of_another_split_or_without_model_stages_are_refused():
    with pytest.raises(CostError, match="4 model stages, the calibration 2"):
        costs_from_runs(SOLO, [(build("zb-v", 2, 4), simulate(build("zb-v", 2, 4), replace(SOLO, host=None)))])
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
