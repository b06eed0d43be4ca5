"""Data-parallel replicas that share a host: the replicated schedule, the DES of every
replica together, and how calibration describes the sharing."""
from dataclasses import replace

import pytest

from pipesched.schedules.ir import ScheduleError, Task
from pipesched.schedules.registry import build
from pipesched.schedules.replicas import replicate
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.data_parallel import allreduce_after_ready
from pipesched.simulator.costs import CostModel, DataParallel, HostSharing, StageCost
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, Span, Trace


def test_replicas_are_shifted_copies_on_their_own_ranks():
    s = build("zb-v", 2, 4)
    r = replicate(s, 3)
    validate(r)
    assert (r.ranks, r.microbatches, len(r.stages), len(r.paths)) == (6, 12, 12, 3)
    for q in range(3):
        for rank in range(2):
            moved = [Task(t.op, t.mb + 4 * q, t.stage + 4 * q) for t in s.programs[rank]]
            assert r.programs[2 * q + rank] == moved
            assert r.stages_of_rank(2 * q + rank) == [v + 4 * q for v in s.stages_of_rank(rank)]
    assert r.path_of(9) == [v + 8 for v in s.path_of(1)]
    assert replicate(s, 1) is s


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_replica_counts_are_refused(bad):
    with pytest.raises(ScheduleError, match="replicas must be an integer >= 1"):
        replicate(build("1f1b", 2, 2), bad)


def costs(host, switching=0.0, degree=2, bandwidth=1e9):
    """1F1B-shaped stages of F = 1 s, BW = 2 s with 1e9 gradient bytes each."""
    stage = StageCost(1.0, 1.0, 1.0, backward_full=2.0, weight_grad_bytes=1e9)
    return CostModel(model_stages=(stage, stage), data_parallel=DataParallel(degree, 0.0, bandwidth),
                     host=None if host is None else HostSharing(capacity=host, pinned=True, switching=switching))


def compute_spans(trace, rank):
    return sorted((s.start, s.end, s.op, s.mb) for s in trace.spans(lane=COMPUTE, rank=rank) if s.op != "OPT")


def test_twins_on_one_core_run_in_lockstep_at_half_speed():
    # 1F1B p = 2, m = 2 alone: rank 1 F0 1..2, BW0 2..4, F1 4..5, BW1 5..7; rank 0 ends
    # with BW1 7..9. With 2 replicas on 2 cores, pinned round-robin, ranks 0 and 2 (each
    # replica's pipeline rank 0) share core 0 and always compute together: every time
    # doubles, and x 1.5 more with switching 0.5.
    s = build("1f1b", 2, 2)
    alone = simulate(s, costs(None, degree=1))
    for switching, factor in ((0.0, 2.0), (0.5, 3.0)):
        shared = simulate(s, costs(2.0, switching))
        assert shared.ranks == 2 and shared.meta["replicas_simulated"] == 2
        for rank in range(2):
            got, want = compute_spans(shared, rank), compute_spans(alone, rank)
            assert [(op, mb) for _, _, op, mb in got] == [(op, mb) for _, _, op, mb in want]
            assert [t for a, b, _, _ in got for t in (a, b)] == pytest.approx(
                [t * factor for a, b, _, _ in want for t in (a, b)])
        # stage 1's all-reduce (1 s at 1 GB/s over d = 2) starts at its last BW's end
        ar = sorted((x.rank, x.start, x.end) for x in shared.spans(lane=ALLREDUCE))
        assert [r for r, _, _ in ar] == [0, 1]
        assert [t for _, a, b in ar for t in (a, b)] == pytest.approx(
            [9 * factor, 9 * factor + 1, 7 * factor, 7 * factor + 1])
    # a core per rank: no sharing, the timeline of one replica
    dedicated = simulate(s, costs(4.0))
    assert compute_spans(dedicated, 0) == compute_spans(alone, 0)


def test_an_allreduce_waits_for_the_latest_replica():
    # 3 cores for 4 ranks: global rank 3 (replica 1's pipeline rank 1) shares core 0 with
    # rank 0, so the replicas' timelines differ; each stage's all-reduce starts when both
    # copies of its last BW have ended.
    s = build("1f1b", 2, 4)
    c = costs(3.0)
    everyone = simulate(replicate(s, 2), CostModel(model_stages=c.model_stages, host=c.host))
    trace = simulate(s, c)
    for rank in range(2):
        last = [max(x.end for x in everyone.spans(lane=COMPUTE, rank=rank + 2 * q) if x.op == "BW")
                for q in range(2)]
        assert last[0] != pytest.approx(last[1])
        (ar,) = trace.spans(lane=ALLREDUCE, rank=rank)
        assert ar.start == pytest.approx(max(last))
        assert compute_spans(trace, rank) == compute_spans(everyone, rank)
    assert compute_metrics(trace).makespan > compute_metrics(simulate(s, costs(None))).makespan


def test_an_allreduce_costs_from_when_every_replica_is_ready():
    # rank 0's W of stage 0 ends at 3, its replica's (global rank 2, same program) at 4:
    # bucket 0 (3..6) costs 2 s after both are ready, bucket 1 (6..7) 1 s; rank 1 has
    # no replica spans that match its program, so its span counts whole
    spans = [Span(0, COMPUTE, "F", 0, 0, 0.0, 1.0), Span(0, COMPUTE, "B", 0, 0, 1.0, 2.0),
             Span(0, COMPUTE, "W", 0, 0, 2.0, 3.0), Span(0, ALLREDUCE, "W", 0, 0, 3.0, 6.0),
             Span(0, ALLREDUCE, "W", 1, 0, 6.0, 7.0),
             Span(1, COMPUTE, "F", 0, 1, 1.0, 2.0), Span(1, COMPUTE, "BW", 0, 1, 2.0, 3.0),
             Span(1, ALLREDUCE, "BW", 0, 1, 3.0, 3.5)]
    trace = Trace.from_spans("zb-h1", 2, 1, "measured", spans)
    trace.meta["replica_compute"] = [[2, 0.0, 1.5], [2, 1.5, 2.5], [2, 2.5, 4.0], [3, 1.0, 2.0]]
    assert allreduce_after_ready(trace) == [(0, 0, 0, 2.0), (0, 0, 1, 1.0), (1, 1, 0, 0.5)]
    trace.meta.pop("replica_compute")
    assert allreduce_after_ready(trace) == [(0, 0, 0, 3.0), (0, 0, 1, 1.0), (1, 1, 0, 0.5)]


torch = pytest.importorskip("torch")
from pipesched.executor.dp_calibrate import (DataParallelProfile, allreduce_in_runs, cores_shared,  # noqa: E402
                                             replica_sharing, with_data_parallel)


def profile(slowdown, cores=2, runs=()):
    return DataParallelProfile(2, {0: slowdown, 1: slowdown}, {0: 0.5, 1: 0.5}, {0: 1e6, 1: 1e6}, [], [],
                               latency=0.0, bandwidth=1e9, cores=cores, threads=1, runs=list(runs))


def test_round_robin_pinning_counts_the_ranks_of_a_core():
    assert [cores_shared(r, 4, 2) for r in range(4)] == [2, 2, 2, 2]
    assert [cores_shared(r, 5, 2) for r in range(5)] == [3, 2, 3, 2, 3]
    assert cores_shared(0, 2, 16) == 1


def test_replica_slowdown_beyond_the_ranks_per_core_is_switching():
    base = CostModel(model_stages=(StageCost(1.0, 1.0, 1.0),) * 2)
    host = replica_sharing(base, profile(2.2), 2)  # 4 ranks on 2 cores, alone 1 per core
    assert host.pinned and host.capacity == 2 and host.switching == pytest.approx(0.1)
    assert replica_sharing(base, profile(1.1, cores=16), 2) is None  # a core each
    shared = CostModel(model_stages=(StageCost(1.0, 1.0, 1.0),) * 4, host=HostSharing(2.0, pinned=True, switching=0.3))
    assert replica_sharing(shared, profile(2.2), 4).switching == 0.3  # replica 0 already shared cores
    step = with_data_parallel(base, profile(2.2), 2)
    assert step.model_stages[0].forward == 1.0 and step.model_stages[0].optimizer_time == 0.5
    assert with_data_parallel(base, profile(1.1, cores=16), 2).model_stages[0].forward == pytest.approx(1.1)


def test_allreduces_in_runs_scale_the_link():
    # 1e6 bytes over d = 2 at 1 GB/s: 1 ms; the run's spans took 2 ms and 4 ms: x 3
    s = build("1f1b", 2, 2)
    spans = [Span(0, ALLREDUCE, "BW", 0, 0, 1.0, 1.002), Span(1, ALLREDUCE, "BW", 0, 1, 1.0, 1.004)]
    trace = Trace.from_spans("1f1b", 2, 2, "measured", spans)
    p = profile(2.0, runs=[(s, trace)])
    link = DataParallel(2, 0.0, 1e9)
    assert allreduce_in_runs(p, link) == pytest.approx(3.0)
    assert allreduce_in_runs(profile(2.0), link) == 1.0


def test_the_link_is_slowed_as_buckets_of_the_profiled_size_were():
    # a run at the other split (4 model stages: 0.5e6 bytes each, 0.5 ms at 1 GB/s) took
    # 10x; the profiled split's buckets are 1e6 bytes, so only the 1F1B run's x 3 counts,
    # and a split of 0.5e6-byte buckets takes the other run's x 10
    s, v = build("1f1b", 2, 2), build("zb-v", 2, 2)
    spans = [Span(0, ALLREDUCE, "BW", 0, 0, 1.0, 1.002), Span(1, ALLREDUCE, "BW", 0, 1, 1.0, 1.004)]
    other = [Span(0, ALLREDUCE, "W", 0, 3, 1.0, 1.005), Span(1, ALLREDUCE, "W", 0, 2, 1.0, 1.005)]
    runs = [(s, Trace.from_spans("1f1b", 2, 2, "measured", spans)), (v, Trace.from_spans("zb-v", 2, 2, "measured", other))]
    link = DataParallel(2, 0.0, 1e9)
    assert allreduce_in_runs(profile(2.0, runs=runs), link) == pytest.approx(3.0)
    small = replace(profile(2.0, runs=runs), grad_bytes={k: 5e5 for k in range(4)})
    assert allreduce_in_runs(small, link) == pytest.approx(10.0)
