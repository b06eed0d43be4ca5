"""Data parallelism in the simulator: the step's tail (gradient all-reduce, optimizer step),
checked against hand-computed timelines. Ring all-reduce of n bytes over d replicas:
2(d-1) * latency + 2(d-1)/d * n / bandwidth seconds."""
import json

import numpy as np
import pytest

from pipesched.cli import main
from pipesched.schedules.registry import build
from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, CostModel, DataParallel, StageCost, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, SPAN_OPS, Trace, TraceError


def stages(*grad_bytes, optimizer=0.0):
    """Model stages of F = B = W = 1 s with these weight-gradient bytes."""
    return tuple(StageCost(1.0, 1.0, 1.0, weight_grad_bytes=n, optimizer_time=optimizer) for n in grad_bytes)


def tail(trace, lane):
    """(rank, stage, mb, start, end) of the tail's spans on `lane` (OPT only on compute)."""
    spans = [s for s in trace.spans(lane=lane) if lane == ALLREDUCE or s.op == "OPT"]
    return sorted((s.rank, s.stage, s.mb, s.start, s.end) for s in spans)


@pytest.mark.parametrize("engine", ["exact", "des"])
def test_1f1b_allreduce_of_the_last_stage_hides_under_the_first_stages_cool_down(engine):
    # 1F1B, p = 2, m = 2, F = 1, BW = 2: rank 1's last BW ends at 7, rank 0's at 9.
    # Stage 1's 1e9 bytes over d = 2 take 1e9 / bandwidth: 1 s at 1 GB/s (7..8, hidden
    # under rank 0's BW 7..9), 4 s at 250 MB/s (7..11: 2 s exposed).
    s = build("1f1b", 2, 2)
    for bandwidth, ar_end, exposed in ((1e9, 8.0, 0.0), (2.5e8, 11.0, 2.0)):
        costs = CostModel(model_stages=stages(0.0, 1e9), data_parallel=DataParallel(2, bandwidth=bandwidth))
        trace = simulate(s, costs, engine=engine)
        m = compute_metrics(trace)
        assert tail(trace, ALLREDUCE) == [(0, 0, 0, 9.0, 9.0), (1, 1, 0, 7.0, ar_end)]
        assert tail(trace, COMPUTE) == [(0, 0, 0, 9.0, 9.0), (1, 1, 0, ar_end, ar_end)]
        assert m.makespan == max(9.0, ar_end) and m.allreduce_exposed == exposed
        assert m.allreduce_time == ar_end - 7.0
        assert trace.meta["data_parallel"]["exposed_allreduce"] == exposed


@pytest.mark.parametrize("engine", ["exact", "des"])
def test_zb_h2_allreduce_of_the_first_stage_to_finish_hides_under_later_ws(engine):
    # ZB-H2, p = 3, m = 3, F = B = W = 1: rank 1's W2@1 ends at 10, ranks 0 and 2 run
    # their W2 10..11. Stage 1's all-reduce at d = 4 over 1 GB/s: 1.5 x n / 1e9 s
    # (the other stages have no gradient bytes, and no latency is paid).
    s = build("zb-h2", 3, 3)
    for n, exposed in ((0.6e9, 0.0), (2e9, 2.0)):
        costs = CostModel(model_stages=stages(0.0, n, 0.0), data_parallel=DataParallel(4, 0.0, 1e9))
        trace = simulate(s, costs, engine=engine)
        ar = 1.5 * n / 1e9
        assert [x[:3] for x in tail(trace, ALLREDUCE)] == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
        assert tail(trace, ALLREDUCE)[1][3:] == pytest.approx((10.0, 10.0 + ar), abs=1e-12)
        m = compute_metrics(trace)
        assert m.makespan == pytest.approx(max(11.0, 10.0 + ar), abs=1e-12)
        assert m.allreduce_exposed == pytest.approx(exposed, abs=1e-12)


def test_buckets_are_all_reduced_one_after_another_each_paying_the_latency():
    # 1e9 bytes in buckets of 4e8: 4e8, 4e8, 2e8; d = 4, latency 0.1 s, 1 GB/s:
    # 0.6 + 1.5 x size / 1e9 s each: 1.2, 1.2, 0.9, from rank 1's last BW at 7.
    costs = CostModel(model_stages=stages(0.0, 1e9), data_parallel=DataParallel(4, 0.1, 1e9, bucket_bytes=4e8))
    trace = simulate(build("1f1b", 2, 2), costs)
    got = [x for x in tail(trace, ALLREDUCE) if x[0] == 1]
    assert [x[2] for x in got] == [0, 1, 2]
    assert np.allclose([x[3:] for x in got], [(7.0, 8.2), (8.2, 9.4), (9.4, 10.3)])
    m = compute_metrics(trace)
    # rank 0's stage 0 (0 bytes) still pays 0.6 s of latency: 9..9.6
    assert m.makespan == pytest.approx(10.3) and m.allreduce_exposed == pytest.approx(1.3)


def test_optimizer_runs_after_the_pipeline_and_the_stages_all_reduce():
    # interleaved, p = 2, v = 2 (4 model stages of 1/2 the pipeline stage's costs):
    # each virtual stage is all-reduced and stepped on its own, in the order it finished.
    s = build("interleaved-1f1b", 2, 4, 2)
    base = simulate(s, uniform())
    costs = uniform(param_bytes=2e9, optimizer_time=0.5, data_parallel=DataParallel(2, bandwidth=1e9))
    trace = simulate(s, costs)
    for r in range(2):
        weights = [x for x in base.spans(lane=COMPUTE, rank=r) if x.op in ("W", "BW")]
        ready = sorted((max(x.end for x in weights if x.stage == v), v) for v in {x.stage for x in weights})
        free, expected_ar, finished = 0.0, [], []
        for t, v in ready:  # 1e9 bytes per virtual stage (param_bytes scaled by 1/2): 1 s each
            start = max(t, free)
            free = start + 1.0
            expected_ar.append((r, v, 0, start, free))
            finished.append((free, v))
        assert [x for x in tail(trace, ALLREDUCE) if x[0] == r] == sorted(expected_ar)
        compute_free, expected_opt = max(x.end for x in weights), []
        for done, v in sorted(finished):
            start = max(compute_free, done)
            compute_free = start + 0.25  # optimizer_time scaled by 1/2
            expected_opt.append((r, v, 0, start, compute_free))
        assert [x for x in tail(trace, COMPUTE) if x[0] == r] == sorted(expected_opt)


def test_one_replica_without_optimizer_time_is_the_pipeline_alone():
    s = build("zb-h1", 4, 8)
    plain = simulate(s, uniform(2, 1, 1, latency=0.1, bandwidth=1e9, activation_bytes=1e8))
    dp1 = simulate(s, uniform(2, 1, 1, latency=0.1, bandwidth=1e9, activation_bytes=1e8, weight_grad_bytes=1e9,
                              data_parallel=DataParallel(1, 1.0, 1e3, 10.0)))
    assert plain.to_dict() == dp1.to_dict()
    assert compute_metrics(dp1).allreduce_exposed == 0.0
    # the optimizer alone (d = 1) adds its steps after the pipeline and no all-reduce
    opt = simulate(s, uniform(2, 1, 1, optimizer_time=0.5))
    assert not (opt.lane == ALLREDUCE).any()
    assert compute_metrics(opt).makespan == compute_metrics(simulate(s, uniform(2, 1, 1))).makespan + 0.5


def test_the_tail_round_trips_through_trace_and_cost_files(tmp_path):
    costs = uniform(param_bytes=1e9, optimizer_time=0.1, data_parallel=DataParallel(2, 1e-5, 1e9, 3e8))
    cost_files.save(costs, tmp_path / "c.json")
    assert cost_files.load(tmp_path / "c.json") == costs
    trace = simulate(build("1f1b", 2, 4), costs)
    trace.save(tmp_path / "t.json")
    again = Trace.load(tmp_path / "t.json")
    assert again.to_dict() == trace.to_dict() and (again.lane == ALLREDUCE).sum() == 2 * 4
    assert (again.op == SPAN_OPS.index("OPT")).sum() == 2


def test_hand_written_cost_file_takes_units(tmp_path):
    (tmp_path / "c.toml").write_text('[stage]\nweight_grad_bytes = "1GB"\noptimizer_time = "2ms"\n'
                                     '[data_parallel]\ndegree = 4\nbandwidth = "25GB/s"\nlatency = "1ms"\n'
                                     'bucket_bytes = "25MiB"\n')
    c = cost_files.load(tmp_path / "c.toml")
    assert c.data_parallel == DataParallel(4, 1e-3, 25e9, 25 * 2 ** 20)
    assert (c.stages[0].weight_grad_bytes, c.stages[0].optimizer_time) == (1e9, 2e-3)


@pytest.mark.parametrize("dp, message", [
    ({"degree": 0}, "degree must be an integer"), ({"degree": 1.5}, "degree must be an integer"),
    ({"bandwidth": 0}, "bandwidth must be > 0"), ({"latency": -1}, "latency must be finite"),
    ({"bucket_bytes": 0}, "bucket_bytes must be"), ({"bucket": 1}, "unknown field 'bucket'"),
])
def test_bad_data_parallel_costs_are_refused(dp, message):
    with pytest.raises(CostError, match=message):
        cost_files.from_dict({"data_parallel": dp})


def test_a_trace_with_an_allreduce_to_a_peer_is_refused():
    doc = simulate(build("1f1b", 2, 2), uniform(data_parallel=DataParallel(2))).to_dict()
    row = next(r for r in doc["spans"] if r[1] == "allreduce")
    row[7] = 1 - row[0]
    with pytest.raises(TraceError, match="need -1 for allreduce"):
        Trace.from_dict(doc)


def refused(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("flags, message", [
    (["--dp", "0"], "--dp must be an integer >= 1"),
    (["--dp", "2", "--dp-bandwidth", "0"], "--dp-bandwidth must be > 0"),
    (["--dp", "2", "--dp-bandwidth", "fast"], "expected a bandwidth"),
    (["--dp", "2", "--dp-latency=-1ms"], "--dp-latency must be finite and >= 0"),
    (["--dp", "2", "--dp-bucket", "0"], "--dp-bucket must be > 0"),
    (["--dp", "2", "--dp-bucket", "1", "--weight-grad-bytes", "1TB"], "more than 1,000,000 buckets"),
    (["--dp", "100000000"], "degree must be an integer in 1..1,000,000"),
    (["--optimizer-time", "inf"], "--optimizer-time must be finite"),
])
def test_bad_data_parallel_flags_are_one_line(capsys, flags, message):
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "2", *flags], message)


def test_noisy_runs_include_the_tail():
    from pipesched.schedules.validate import validate
    from pipesched.simulator.stochastic import sample_makespans
    costs = CostModel(model_stages=stages(0.0, 1e9), data_parallel=DataParallel(2, bandwidth=2.5e8))
    # no noise: every run is the hand-computed step of 11 s (see the 1F1B case above)
    assert sample_makespans(validate(build("1f1b", 2, 2)), costs, 3, 0.0).tolist() == [11.0] * 3


def test_simulate_reports_the_exposed_allreduce(capsys):
    argv = ["simulate", "1f1b", "-p", "2", "-m", "2", "--dp", "2", "--dp-bandwidth", "250MB/s",
            "--weight-grad-bytes", "1GB", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # both stages 1e9 bytes, 4 s each: rank 1 7..11, rank 0 9..13
    assert out["makespan"] == 13.0 and out["allreduce_exposed"] == 4.0 and out["allreduce_time"] == 8.0


def test_figures_and_perfetto_show_the_allreduce_lane():
    pytest.importorskip("matplotlib")
    from pipesched.plots.timeline import plot_timeline
    from pipesched.simulator.perfetto import to_chrome_trace
    costs = uniform(param_bytes=1e9, optimizer_time=0.25,
                    data_parallel=DataParallel(2, bandwidth=1e9, bucket_bytes=4e8))
    trace = simulate(build("zb-h1", 2, 4), costs)
    fig = plot_timeline(trace)
    found = {c.get_gid(): c for c in fig.axes[0].collections if c.get_gid()}
    # 1e9 bytes per stage in buckets of 4e8: 3 all-reduces on each of 2 ranks; one OPT box per rank
    assert len(found["allreduce"].get_paths()) == 6 and len(found["compute:OPT"].get_paths()) == 2
    events = to_chrome_trace(trace)["traceEvents"]
    threads = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    assert {(0, "DP all-reduce"), (1, "DP all-reduce")} <= threads
    assert sum(e.get("cat") == "allreduce" for e in events) == 6
    assert sum(e.get("cat") == "OPT" for e in events) == 2


@pytest.mark.parametrize("command", ["run", "calibrate", "validate"])
def test_executor_commands_refuse_bad_replicas_before_launching(capsys, tmp_path, command):
    pytest.importorskip("torch")
    extra = ["-o", str(tmp_path / "c.json")] if command == "calibrate" else []
    refused(capsys, [command, "1f1b", "-p", "2", "-m", "2", "--dp", "0", *extra], "--dp must be an integer >= 1")
    refused(capsys, [command, "1f1b", "-p", "2", "-m", "2", "--dp", "100000", *extra], "ranks")
    assert not (tmp_path / "c.json").exists()
