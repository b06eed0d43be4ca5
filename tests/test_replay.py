"""Replay: a run simulated again with the durations it measured (simulator.replay)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipesched.schedules.ir import OPS
from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.compare import compare
from pipesched.simulator.costs import HostOverhead, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.replay import ReplayError, measured_task_times, replay
from pipesched.simulator.trace import COMPUTE, RECV
from pipesched.schedules.validate import validate

from helpers import run_with_receive_takes

COSTS = uniform(1e-3, 1.2e-3, 0.8e-3, latency=50e-6, bandwidth=1e9, activation_bytes=1e5,
                host_overhead=HostOverhead(per_op=20e-6, per_send=30e-6, per_recv=10e-6, per_take=5e-6))


@pytest.mark.parametrize("name, p, m", [("1f1b", 4, 8), ("zb-h1", 2, 6), ("interleaved-1f1b", 2, 4),
                                        ("zb-v", 2, 4), ("dualpipev", 4, 8), ("gpipe", 3, 5)])
def test_replaying_a_simulation_gives_it_back(name, p, m):
    schedule = build(name, p, m)
    trace = simulate(schedule, COSTS)
    again = replay(schedule, trace, COSTS)
    assert not again.meta["replayed_transfers"]  # a simulation does not record receive takes
    np.testing.assert_allclose(np.sort(again.end), np.sort(trace.end), rtol=0, atol=1e-12)
    assert compare(again, trace).makespan_rel_error == pytest.approx(0, abs=1e-12)


def test_a_slow_op_measured_is_a_slow_op_replayed():
    schedule = build("1f1b", 2, 4)
    trace = simulate(schedule, COSTS)
    last = np.flatnonzero((trace.lane == COMPUTE) & (trace.rank == 0))
    last = last[np.argmax(trace.end[last])]
    slow = replace(trace, end=trace.end.copy())
    slow.end[last] += 5e-3  # the step's last op took 5 ms longer
    before = compute_metrics(trace).makespan
    assert compute_metrics(replay(schedule, slow, COSTS)).makespan == pytest.approx(before + 5e-3, rel=1e-12)


def test_a_transfer_waited_for_arrives_when_the_run_saw_it_arrive():
    schedule = build("1f1b", 2, 2)
    trace = simulate(schedule, COSTS)
    graph = validate(schedule)
    # F0 on rank 1 consumes the activation of F0 on rank 0; say rank 1 began taking it at
    # once and the data came 3 ms later than the link model says
    recv = np.flatnonzero((trace.lane == RECV) & (trace.mb == 0) & (trace.op == OPS.index("F")))[0]
    late = replace(trace, end=trace.end.copy(), meta={**trace.meta})
    arrival = late.end[recv] + 3e-3
    late.end[recv] = arrival
    late.meta["receive_takes"] = [[1, "F", 0, 0, 0, float(trace.end[recv])]]
    again = replay(graph, late, COSTS)
    assert again.meta["replayed_transfers"]
    f0 = np.flatnonzero((again.lane == COMPUTE) & (again.rank == 1) & (again.mb == 0) & (again.op == 0))[0]
    assert again.start[f0] == pytest.approx(arrival + COSTS.host_overhead.per_take, abs=1e-12)


def test_a_send_held_for_a_late_receive_does_not_hold_up_the_link():
    """gloo sends once the receiver has posted: a transfer whose receive was posted late
    waited for the posting, not for the link, so the sends behind it go on time (a
    replay does not queue measured transfers on their link again)."""
    schedule = build("gpipe", 2, 4)  # rank 0 sends F0..F3 back to back on one link
    trace = simulate(schedule, COSTS)
    graph = validate(schedule)
    recvs = {int(trace.mb[i]): i for i in np.flatnonzero((trace.lane == RECV) & (trace.op == OPS.index("F")))}
    late = replace(trace, start=trace.start.copy(), end=trace.end.copy(), meta={**trace.meta})
    link = late.end[recvs[0]] - late.start[recvs[0]]
    late.start[recvs[0]] += 5e-3  # rank 1 posted F0's receive 5 ms late and waited for it
    late.end[recvs[0]] += 5e-3
    late.meta["receive_takes"] = [[1, "F", 0, 0, 0, float(trace.end[recvs[0]])],
                                  [1, "F", 1, 0, 0, float(trace.end[recvs[1]] + 6e-3)]]
    again = replay(graph, late, COSTS, host="costs")
    f1 = np.flatnonzero((again.lane == RECV) & (again.op == OPS.index("F")) & (again.mb == 1))[0]
    assert again.end[f1] == pytest.approx(trace.end[recvs[1]], abs=1e-9)  # not queued behind F0's 5 ms
    f0 = np.flatnonzero((again.lane == COMPUTE) & (again.rank == 1) & (again.mb == 0) & (again.op == 0))[0]
    assert again.start[f0] == pytest.approx(late.end[recvs[0]] + COSTS.host_overhead.per_take, abs=1e-9)
    assert link > 0 and COSTS.contention  # the simulation queues transfers; the replay keeps their times


def test_per_kind_replay_uses_each_ranks_median():
    schedule = build("1f1b", 2, 3)
    trace = simulate(schedule, COSTS)
    graph = validate(schedule)
    noisy = replace(trace, end=trace.end.copy())
    f_rank0 = np.flatnonzero((trace.lane == COMPUTE) & (trace.rank == 0) & (trace.op == 0))
    noisy.end[f_rank0] += np.array([0.0, 1e-3, 2e-3])  # durations 1, 2, 3 ms: median 2 ms
    times = measured_task_times(graph, noisy, "kind")
    col = graph.columns()
    assert times[(col["rank"] == 0) & (col["op"] == 0)] == pytest.approx([2e-3] * 3)
    assert times[(col["rank"] == 1) & (col["op"] == 0)] == pytest.approx([1e-3] * 3)


def test_a_trace_of_another_schedule_is_refused():
    trace = simulate(build("1f1b", 2, 4), COSTS)
    with pytest.raises(ReplayError, match="p=2, m=4"):
        replay(build("1f1b", 2, 6), trace, COSTS)
    with pytest.raises(ReplayError, match="no span of"):
        replay(build("zb-h1", 2, 4), trace, COSTS)
    with pytest.raises(ReplayError, match="replay mode"):
        replay(build("1f1b", 2, 4), trace, COSTS, per="rank")


@pytest.mark.parametrize("name", ["zb-h1", "dualpipe", "dualpipev"])
def test_host_time_is_read_back_from_a_run(monkeypatch, name):
    """A run's host costs, recovered from its gaps between ops that waited for nothing
    and, in DualPipe's pairs, between a pair's two ops; the replay then gives the run back."""
    import pipesched.simulator.replay as replay_module

    monkeypatch.setattr(replay_module, "WAIT_MARGIN", 0.0)  # a simulated run's waits are exact
    from pipesched.simulator.replay import fit_host_time

    truth = HostOverhead(per_op=40e-6, per_send=250e-6, per_recv=120e-6, per_take=30e-6)
    costs = replace(COSTS, host_overhead=truth, recv_lookahead=2)
    schedule = build(name, 4, 8)
    graph, run = run_with_receive_takes(schedule, costs)
    unknown = replace(costs, host_overhead=HostOverhead())
    fitted = fit_host_time(graph, run, unknown).host_overhead
    for field in ("per_op", "per_send", "per_recv", "per_take"):
        assert getattr(fitted, field) == pytest.approx(getattr(truth, field), rel=1e-6), field
    again = replay(schedule, run, unknown)
    assert compute_metrics(again).makespan == pytest.approx(compute_metrics(run).makespan, rel=1e-9)


def test_a_replay_gives_each_rank_its_own_host_time(monkeypatch):
    """Ranks whose host time differs by a factor (as core sharing stretches it): each
    rank's host costs add up to its own gaps; ranks alike keep the common fit, exact."""
    import pipesched.simulator.replay as replay_module

    monkeypatch.setattr(replay_module, "WAIT_MARGIN", 0.0)
    base = HostOverhead(per_op=40e-6, per_send=250e-6, per_recv=120e-6, per_take=30e-6)
    truth = [replace(base, per_op=base.per_op * k, per_send=base.per_send * k, per_recv=base.per_recv * k,
                     per_take=base.per_take * k) for k in (1.0, 3.0, 1.0, 2.0)]
    costs = replace(COSTS, host_overhead=base, recv_lookahead=2)
    schedule = build("1f1b", 4, 8)
    graph, run = run_with_receive_takes(schedule, costs, host_by_rank=truth)
    rows, gaps, ranks = replay_module._host_gaps(graph, run, 2)
    fitted = replay_module.host_time_by_rank(graph, run, costs)
    for r, o in enumerate(fitted):
        coef = np.array([o.per_op, o.per_send, o.per_recv, o.per_take])
        assert (rows[ranks == r] @ coef).sum() == pytest.approx(gaps[ranks == r].sum(), rel=1e-9)
    assert fitted[1].per_op > fitted[3].per_op > fitted[0].per_op
    assert replay(schedule, run, replace(costs, host_overhead=HostOverhead())).meta["host_from_run"]

    from pipesched.simulator.timing import resolve
    with pytest.raises(ValueError, match="one host overhead per rank"):
        resolve(graph, costs, host_by_rank=[base] * 3)
    many = validate(build("1f1b", 70, 70))  # more ranks than numpy's choose takes (64)
    one = resolve(many, costs)
    slow_last = resolve(many, costs, host_by_rank=[base] * 69 + [base.scaled(2.0)])
    last = np.asarray(many.unit_rank) == 69
    assert np.array_equal(one.host.post[~last], slow_last.host.post[~last])
    assert slow_last.host.post[last] == pytest.approx(2 * one.host.post[last])

    graph, alike = run_with_receive_takes(schedule, costs, host_by_rank=[base] * 4)
    for o in replay_module.host_time_by_rank(graph, alike, costs):
        assert o.per_send == pytest.approx(base.per_send, rel=1e-6) and o.per_op == pytest.approx(base.per_op, rel=1e-6)
    again = replay(schedule, alike, replace(costs, host_overhead=HostOverhead()))
    assert compute_metrics(again).makespan == pytest.approx(compute_metrics(alike).makespan, rel=1e-9)


def test_a_data_parallel_replay_takes_each_all_reduce_and_optimizer_step_as_measured():
    from pipesched.simulator.costs import CostModel, DataParallel, StageCost
    from pipesched.simulator.trace import ALLREDUCE

    # a 1e6-byte all-reduce over 2 replicas at 1e6 B/s takes 1 s, the optimizer 0.5 s
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0, param_bytes=1e6, optimizer_time=0.5),),
                      data_parallel=DataParallel(2, 0.0, 1e6))
    schedule = build("1f1b", 2, 4)
    run = simulate(schedule, costs)
    assert compute_metrics(replay(schedule, run, costs)).makespan == pytest.approx(compute_metrics(run).makespan)
    slow = replace(run, end=run.end.copy())
    last = [i for i in np.flatnonzero(run.lane == ALLREDUCE) if run.rank[i] == 0]  # rank 0 finishes last
    slow.end[last] += 3.0  # its all-reduce waited 3 s longer (e.g. for the other replica)
    got = compute_metrics(replay(schedule, slow, costs)).makespan
    assert got == pytest.approx(compute_metrics(run).makespan + 3.0)


def test_after_a_wait_a_unit_starts_its_ranks_wake_latency_after_the_data(monkeypatch):
    """The time from a waited-for input's arrival to the unit's start is read per rank and
    per input; a replay gives that unit that much, not the whole fitted take, and moves
    the rest of the take before the wait (a unit whose data is there still takes it all)."""
    import pipesched.simulator.replay as replay_module
    from pipesched.simulator.timing import resolve

    monkeypatch.setattr(replay_module, "WAIT_MARGIN", 0.0)
    costs = replace(COSTS, recv_lookahead=2)
    schedule = build("1f1b", 4, 8)
    graph, run = run_with_receive_takes(schedule, costs)
    wake = replay_module.wake_latency(graph, run)
    assert wake[1:] == pytest.approx([COSTS.host_overhead.per_take] * 3, rel=1e-9)  # ranks 1-3 wait for inputs

    host = resolve(graph, replace(costs, host_overhead=replace(costs.host_overhead, per_take=1e-3))).host
    moved = replay_module._take_after_wait(graph, run, host)
    inputs = replay_module._inputs_taken(graph)
    known = np.isfinite(wake[np.asarray(graph.unit_rank)])
    np.testing.assert_allclose(moved.take[known], COSTS.host_overhead.per_take * inputs[known], rtol=1e-9)
    np.testing.assert_allclose(moved.pre + moved.take, host.pre + host.take, rtol=1e-12)
    monkeypatch.setattr(replay_module, "wake_latency", lambda g, m: np.concatenate(([np.nan], wake[1:])))
    unknown = np.asarray(graph.unit_rank) == 0  # as if rank 0 had never waited: it keeps its take
    kept = replay_module._take_after_wait(graph, run, host)
    assert np.array_equal(kept.take[unknown], host.take[unknown])
    np.testing.assert_allclose(kept.pre[unknown], host.pre[unknown], rtol=0, atol=1e-15)
