"""The executor with data parallelism on real process groups: p = 2 pipeline ranks x
d = 2 replicas = 4 gloo processes, one launch for every case (processes are expensive
on 2 cores). The gradients after the all-reduce are the whole batch's (d x m
microbatches) on every replica, and the measured trace shows the step's tail."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesched.executor.calibrate import CalibrationOptions  # noqa: E402
from pipesched.executor.dp_calibrate import measure_here, with_data_parallel  # noqa: E402
from pipesched.executor.run_calibration import RUN_STEPS  # noqa: E402
from pipesched.executor.job import RunOptions, representative_step, run_schedule  # noqa: E402
from pipesched.executor.validation import assemble  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.placement import host_cores  # noqa: E402
from pipesched.executor.models import ExampleModel  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.costs import CostModel, StageCost  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, Trace  # noqa: E402

pytestmark = pytest.mark.distributed
MLP64 = ExampleModel("mlp", hidden=8, layers_per_stage=2, microbatch_size=4, dtype="float64")

CASES = [  # (id, schedule, options): fused and split backwards, a V, replicas of a model stage, buckets
    ("1f1b", build("1f1b", 2, 4), RunOptions(steps=2, dp=2)),
    ("zb-h1 buckets", build("zb-h1", 2, 4), RunOptions(dp=2, bucket_bytes=300)),
    ("dualpipe", build("dualpipe", 2, 2), RunOptions(dp=2)),
    ("interleaved-1f1b", build("interleaved-1f1b", 2, 4, 2), RunOptions(dp=2, bucket_bytes=1)),
]


def run_cases(ctx, cases: list) -> dict | None:
    out = {}
    for case_id, schedule, options in cases:
        result = run_schedule(ctx, schedule, MLP64, options)
        if result is not None:
            out[case_id] = result
    # data parallelism's calibration in the same launch: op times from runs of every replica
    out["profile"], _ = measure_here(ctx, build("1f1b", 2, 4), MLP64, 2,
                                     CalibrationOptions(repeats=2, warmup=1, from_runs=True))
    out["profile_solo"], _ = measure_here(ctx, build("1f1b", 2, 4), MLP64, 2,
                                          CalibrationOptions(repeats=2, warmup=1, from_runs=False))
    # as validate --dp runs it: the validated schedule's steps in turn with the calibration runs'
    out["beside"] = measure_here(ctx, build("gpipe", 2, 4), MLP64, 2, CalibrationOptions(repeats=2, warmup=1,
                                                                                          from_runs=True),
                                 beside=RunOptions(steps=3, warmup=1, dp=2))
    return out if ctx.rank == 0 else None


@pytest.fixture(scope="module")
def results():
    return launch_local(run_cases, (CASES,), 4, "gloo", 240.0)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_gradients_are_the_whole_batchs_on_every_replica(results, case):
    r = results[case]
    assert r.check is not None and r.check.replicas_identical
    assert r.check.grads_match and r.check.loss_matches, r.check
    # the reference ran the whole batch: d x m microbatches, not one replica's m
    schedule = next(s for c, s, _ in CASES if c == case)
    assert r.trace.microbatches == schedule.microbatches and r.trace.meta["data_parallel"]["degree"] == 2
    # each model stage's gradient bytes, as its all-reduce carries them
    built = MLP64.build(schedule.num_model_stages, 2 * schedule.microbatches)
    assert r.trace.meta["data_parallel"]["grad_bytes"] == [
        sum(q.numel() * q.element_size() for q in stage.parameters() if q.requires_grad) for stage in built.stages]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_measured_trace_shows_allreduces_after_the_last_weight_op_and_optimizer_after_them(results, case, tmp_path):
    trace = results[case].trace
    schedule = next(s for c, s, _ in CASES if c == case)
    ar = list(trace.spans(lane=ALLREDUCE))
    opt = [s for s in trace.spans(lane=COMPUTE) if s.op == "OPT"]
    per_rank_stages = {(s.rank, schedule.stages[s.stage].model_stage) for s in trace.spans(lane=COMPUTE)
                       if s.op != "OPT"}
    assert {(s.rank, schedule.stages[s.stage].model_stage) for s in opt} == per_rank_stages
    for s in ar:
        same = [x for x in trace.spans(lane=COMPUTE, rank=s.rank) if x.op in ("W", "BW")
                and schedule.stages[x.stage].model_stage == schedule.stages[s.stage].model_stage]
        assert s.start >= max(x.end for x in same) - 1e-9  # started after the stage's last W/BW
    for s in opt:
        mine = [x for x in ar if x.rank == s.rank and schedule.stages[x.stage].model_stage
                == schedule.stages[s.stage].model_stage]
        pipeline = [x for x in trace.spans(lane=COMPUTE, rank=s.rank) if x.op != "OPT"]
        assert s.start >= max(x.end for x in mine + pipeline) - 1e-9
    if case.endswith("buckets") or case.startswith("interleaved"):  # several buckets per model stage
        assert max(s.mb for s in ar) >= 1
    m = compute_metrics(trace)
    assert m.allreduce_time > 0 and 0 <= m.allreduce_exposed <= m.makespan
    trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json").to_dict() == trace.to_dict()


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_a_ranks_wait_for_its_allreduces_is_waiting_not_host_overhead(results, case):
    r = results[case]
    for row in r.per_rank:
        rank = row["rank"]
        last_op = max(s.end for s in r.trace.spans(lane=COMPUTE, rank=rank) if s.op != "OPT")
        allreduced = max((s.end for s in r.trace.spans(lane=ALLREDUCE, rank=rank)), default=last_op)
        # the tail after the rank's last pipeline op, until its all-reduces end, counts as waiting (most
        # of it: the host's own bookkeeping after the last op, on a shared core, is not waiting)
        assert row["wait_time"] >= 0.5 * (allreduced - last_op)


def test_calibration_reads_op_times_and_the_allreduce_from_runs_of_every_replica(results):
    profile = results["profile"]
    # every step; ZB-V splits the same network in two model stages per rank (the ops' fixed time)
    assert [s.name for s, _ in profile.runs] == ["1f1b"] * RUN_STEPS + ["zb-h1"] * RUN_STEPS + ["zb-v"] * RUN_STEPS
    assert all(t.ranks == 2 and (t.lane == ALLREDUCE).any() for _, t in profile.runs)  # replica 0's, with its tail
    # ... and the other replica's ops, which share the cores with replica 0's
    assert all({int(q) for q, _, _ in t.meta["replica_compute"]} == {2, 3} for _, t in profile.runs)
    assert profile.degree == 2 and profile.bandwidth > 0 and set(profile.optimizer_time) == {0, 1}
    assert profile.replica_slowdown == {}  # free-running is only for solo op times
    solo = CostModel(model_stages=(StageCost(1.0, 1.0, 1.0),) * 2)
    step = with_data_parallel(solo, profile, 2)
    measured = [s.end - s.start for _, t in profile.runs for s in t.spans(lane=COMPUTE) if s.op == "F"]
    assert 0 < step.model_stages[0].forward <= max(measured)  # from the runs, not 1 s
    if host_cores() < 4:  # 4 ranks share the cores: dedicated work, the replicas simulated sharing them
        assert step.host is not None and step.host.pinned and step.host.host_time_first
        assert step.meta["from_runs"]["dedicated"]
    else:
        assert step.host is None
    assert step.data_parallel.degree == 2
    assert step.meta["data_parallel_calibrated"]["runs"] == ["1f1b", "zb-h1", "zb-v"]


def test_the_validated_run_takes_its_steps_in_turn_with_the_calibration_runs(results):
    profile, run = results["beside"]
    assert [s.name for s, _ in profile.runs] == ["1f1b"] * 3 + ["zb-h1"] * 3 + ["zb-v"] * 3  # as many as the run's
    assert run.trace.schedule == "gpipe" and len(run.step_traces) == 3 and run.check.grads_match
    # in turn: the k-th measured steps of the four runs follow one another, before any k+1-th
    steps = [t for _, t in profile.runs]
    order = [t.meta["started"] for k in range(3)
             for t in (steps[k], steps[3 + k], steps[6 + k], run.step_traces[k])]
    assert order == sorted(order)


def test_a_data_parallel_run_reports_the_step_nearest_its_mean_and_validation_holds_the_mean(results):
    profile, run = results["beside"]
    steps = run.trace.meta["makespans"]
    mean = sum(steps) / len(steps)
    assert compute_metrics(run.trace).makespan == pytest.approx(steps[run.trace.meta["step"]])
    assert abs(steps[run.trace.meta["step"]] - mean) == min(abs(m - mean) for m in steps)
    costs = with_data_parallel(CostModel(model_stages=(StageCost(1e-3, 1e-3, 1e-3),) * 2), profile, 2)
    v = assemble(build("gpipe", 2, 4), costs, run, RunOptions(steps=3, warmup=1, dp=2))
    s = v.summary()
    assert s["measured"]["makespan"] == pytest.approx(mean)
    assert s["makespan_rel_error"] == pytest.approx(s["predicted"]["makespan"] / mean - 1)
    assert s["measured"]["step_makespan"] == pytest.approx(steps[run.trace.meta["step"]])


def test_the_reported_step_is_the_median_one_or_with_replicas_the_one_nearest_the_mean():
    steps = [0.30, 0.30, 0.30, 0.40, 0.50, 0.50]  # two groups: the lower median 0.30 s, the mean 0.383 s
    assert representative_step(steps) == 2
    assert representative_step(steps, 2) == 3


def test_with_solo_op_times_the_replicas_share_the_cores_or_scale_the_ops(results):
    profile = results["profile_solo"]
    assert profile.runs == [] and set(profile.replica_slowdown) == {0, 1}
    assert all(f > 0 for f in profile.replica_slowdown.values())
    solo = CostModel(model_stages=(StageCost(1.0, 1.0, 1.0),) * 2)
    step = with_data_parallel(solo, profile, 2)
    if profile.cores < 4:  # 4 ranks outnumber the cores: pinned sharing, op times as profiled
        assert step.host.pinned and step.host.capacity == profile.cores
        assert step.model_stages[0].forward == 1.0
    else:  # a core each: op times x the other replicas' interference
        assert step.host is None
        assert step.model_stages[0].forward == pytest.approx(profile.replica_slowdown[0])


def test_a_bucket_keeps_one_buffer_of_its_gradients_size_and_refuses_another():
    from pipesched.executor.data_parallel import allreduce_bucket, bucket_buffer

    grads = [torch.ones(3, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)]
    flat = bucket_buffer(grads)
    assert (flat.numel(), flat.dtype) == (7, torch.float64)
    with pytest.raises(ValueError, match="holds 6 elements, its gradients 7"):
        allreduce_bucket(grads, None, 1.0, torch.empty(6, dtype=torch.float64))
