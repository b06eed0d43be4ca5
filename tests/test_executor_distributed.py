"""The executor on real process groups (gloo on CPU): every built-in schedule at p = 2
and p = 4, a hand-written schedule file, m < p, both example models, float32, against
the unpipelined reference; the measured trace; timeouts and failures; torchrun.

Processes are expensive on 2 cores, so one launch per group size runs all its cases.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipesched.executor.comm import ExecutorError  # noqa: E402
from pipesched.executor.job import RunOptions, RunResult, run_schedule  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.models import ExampleModel  # noqa: E402
from pipesched.schedules import fileformat  # noqa: E402
from pipesched.schedules.recompute import add_recompute  # noqa: E402
from pipesched.schedules.registry import BUILDERS, build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.trace import COMPUTE, RECV, SEND, Trace  # noqa: E402

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]
MLP64 = ExampleModel("mlp", hidden=8, layers_per_stage=1, microbatch_size=4, dtype="float64")
TRANSFORMER64 = ExampleModel("transformer", hidden=8, layers_per_stage=1, microbatch_size=2, seq=4, dtype="float64")
MLP32 = ExampleModel("mlp", hidden=32, layers_per_stage=2, microbatch_size=8, dtype="float32")
TRANSFORMER32 = ExampleModel("transformer", hidden=32, layers_per_stage=1, microbatch_size=4, seq=8,
                             dtype="float32")

# a V on two ranks written by hand: model stages 0 and 3 on rank 0, 1 and 2 on rank 1 (a
# local turn), fused and split backwards mixed, and one overlapped pair
HAND_WRITTEN = {
    "format": "pipesched.schedule/1", "name": "hand-v", "ranks": 2, "microbatches": 2,
    "stages": [{"rank": 0, "model_stage": 0}, {"rank": 1, "model_stage": 1},
               {"rank": 1, "model_stage": 2}, {"rank": 0, "model_stage": 3}],
    "paths": [[0, 1, 2, 3]],
    "programs": [
        [{"op": "F", "mb": 0, "stage": 0}, {"op": "F", "mb": 1, "stage": 0}, {"op": "F", "mb": 0, "stage": 3},
         {"op": "BW", "mb": 0, "stage": 3}, {"op": "F", "mb": 1, "stage": 3}, {"op": "B", "mb": 1, "stage": 3},
         [{"op": "W", "mb": 1, "stage": 3}, {"op": "BW", "mb": 0, "stage": 0}],
         {"op": "B", "mb": 1, "stage": 0}, {"op": "W", "mb": 1, "stage": 0}],
        [{"op": "F", "mb": 0, "stage": 1}, {"op": "F", "mb": 0, "stage": 2}, {"op": "F", "mb": 1, "stage": 1},
         {"op": "F", "mb": 1, "stage": 2}, {"op": "BW", "mb": 0, "stage": 2}, {"op": "BW", "mb": 0, "stage": 1},
         {"op": "B", "mb": 1, "stage": 2}, {"op": "B", "mb": 1, "stage": 1}, {"op": "W", "mb": 1, "stage": 2},
         {"op": "W", "mb": 1, "stage": 1}]]}
# uneven stages: each model stage its own number of blocks (a partitioner's split)
UNEVEN = [("1f1b uneven 3,1", build("1f1b", 2, 4), replace(MLP64, layers_per_stage=(3, 1)), RunOptions()),
          ("zb-v uneven 1,3,2,1", build("zb-v", 2, 4), replace(TRANSFORMER64, layers_per_stage=(1, 3, 2, 1)),
           RunOptions())]


def run_cases(ctx, cases: list) -> dict | None:
    """The job of one launch: every case in turn; rank 0 returns {case id: RunResult}."""
    out = {}
    for case_id, schedule, model, options in cases:
        result = run_schedule(ctx, schedule, model, options)
        if result is not None:
            out[case_id] = result
    return out if ctx.rank == 0 else None


def cases_for(p: int, m: int, small_m: int) -> list:
    one = RunOptions()
    cases = [(f"{name} m={m}", build(name, p, m), MLP64, one) for name in BUILDERS]
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipe", "dualpipev"):
        mm = max(2, small_m) if name == "dualpipe" else small_m
        cases.append((f"{name} m={mm}", build(name, p, mm), MLP64, one))
    for name in ("1f1b", "zb-v", "dualpipe"):
        cases.append((f"{name} transformer", build(name, p, m), TRANSFORMER64, one))
    return cases


@pytest.fixture(scope="module")
def p2() -> dict[str, RunResult]:
    cases = cases_for(2, 4, 1)
    cases += [
        ("file", fileformat.from_dict(HAND_WRITTEN), MLP64, RunOptions()),
        ("zb-v all receives posted first", build("zb-v", 2, 4), MLP64, RunOptions(lookahead=-1)),
        ("1f1b no lookahead, 2 steps", build("1f1b", 2, 4), MLP64, RunOptions(lookahead=0, steps=2, warmup=1)),
        ("1f1b clock ping", build("1f1b", 2, 4), MLP64, RunOptions(clock_ping=True)),
        ("1f1b min time", build("1f1b", 2, 4), MLP64, RunOptions(steps=2, warmup=1, min_time=10.0, max_steps=6)),
        *UNEVEN,
    ]
    cases += [(f"{name} float32 {model.kind}", build(name, 2, 8), model, RunOptions())
              for name in ("1f1b", "zb-v", "dualpipe") for model in (MLP32, TRANSFORMER32)]
    cases += [(case, schedule, model, RunOptions()) for case, (schedule, model) in RECOMPUTE_CASES.items()]
    return launch_local(run_cases, (cases,), 2, timeout=120)


# recomputation: fused (1F1B) and split (ZB-H1) backwards, a V with a local turn (ZB-V), the
# overlapped pairs of DualPipe, a transformer, and only some model stages recomputing
RECOMPUTE_CASES = {
    "1f1b recompute": (add_recompute(build("1f1b", 2, 4)), MLP64),
    "zb-h1 recompute": (add_recompute(build("zb-h1", 2, 4)), MLP64),
    "zb-v recompute": (add_recompute(build("zb-v", 2, 4)), MLP64),
    "dualpipe recompute": (add_recompute(build("dualpipe", 2, 4)), MLP64),
    "1f1b recompute transformer": (add_recompute(build("1f1b", 2, 4)), TRANSFORMER64),
    "zb-v recompute stages 1, 2": (add_recompute(build("zb-v", 2, 4), [1, 2]), MLP64),
}


@pytest.fixture(scope="module")
def p4() -> dict[str, RunResult]:
    return launch_local(run_cases, (cases_for(4, 8, 2),), 4, timeout=120)


def check_trace(result: RunResult, schedule) -> None:
    """The measured trace is a complete, well-formed Trace of `schedule`."""
    graph = validate(schedule)
    trace = Trace.from_dict(json.loads(json.dumps(result.trace.to_dict())))  # survives the file format
    assert trace.source == "measured" and trace.ranks == schedule.ranks
    compute = [s for s in trace.spans(COMPUTE)]
    assert sorted((s.op, s.mb, s.stage) for s in compute) == sorted(graph.tasks)
    assert min(s.start for s in compute) == 0.0
    transfers = len(graph.transfers)
    sends, recvs = list(trace.spans(SEND)), list(trace.spans(RECV))
    assert len(sends) == len(recvs) == transfers
    assert {(s.op, s.mb, s.stage, s.peer) for s in sends} == \
        {(*graph.tasks[graph.edges[e].src], graph.edge_ranks(e)[1]) for e in graph.transfers}
    assert all(s.end >= s.start for s in trace.spans())
    for rank in range(trace.ranks):  # program order on each rank
        mine = sorted((s for s in compute if s.rank == rank), key=lambda s: s.start)
        order = [graph.task_unit[graph.index[(s.op, s.mb, s.stage)]] for s in mine]
        assert order == sorted(order)
        times, levels = trace.memory[rank]
        assert levels.max() > 0 and levels[-1] == 0, "everything held is released by the step's end"
    metrics = compute_metrics(trace, graph)  # every metric applies unchanged
    assert metrics.makespan > 0 and metrics.critical_path and 0 <= metrics.bubble_ratio < 1
    assert all(r.peak_memory_bytes > 0 for r in metrics.per_rank)


def check_exact(result: RunResult) -> None:
    c = result.check
    assert c.max_grad_rel_error < 1e-6 and c.loss_rel_error < 1e-6, (c.worst, c.max_grad_rel_error)
    assert c.loss_matches and c.grads_match and c.replicas_identical


@pytest.mark.parametrize("case", [c[0] for c in cases_for(2, 4, 1)] + [
    "file", "zb-v all receives posted first", "1f1b no lookahead, 2 steps", "1f1b clock ping"] + [c[0] for c in UNEVEN])
def test_p2_matches_reference_in_float64(p2, case):
    check_exact(p2[case])


@pytest.mark.parametrize("case", [c[0] for c in cases_for(4, 8, 2)])
def test_p4_matches_reference_in_float64(p4, case):
    check_exact(p4[case])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_measured_trace_is_a_complete_trace(p2, p4, name):
    check_trace(p2[f"{name} m=4"], build(name, 2, 4))
    check_trace(p4[f"{name} m=8"], build(name, 4, 8))


@pytest.mark.parametrize("case", RECOMPUTE_CASES)
def test_recomputation_keeps_gradients_exact_and_records_r(p2, case):
    """F runs without a graph, R re-runs it before the backward: the gradients equal the
    reference's, the trace has every R, and the first rank, whose F now keeps only the
    data, holds less at its peak than without recomputation."""
    schedule, _ = RECOMPUTE_CASES[case]
    check_exact(p2[case])
    check_trace(p2[case], schedule)
    rs = [s for s in p2[case].trace.spans(COMPUTE) if s.op == "R"]
    assert len(rs) == sum(t.op == "R" for t in schedule.tasks())
    if case in ("1f1b recompute", "zb-h1 recompute", "zb-v recompute"):
        plain = p2[case.replace(" recompute", "") + " m=4"]
        assert p2[case].trace.memory[0][1].max() < plain.trace.memory[0][1].max()


def test_hand_written_schedule_file_runs(p2, tmp_path):
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(HAND_WRITTEN))
    schedule = fileformat.load(path)
    check_trace(p2["file"], schedule)
    paired = [s for s in p2["file"].trace.spans(COMPUTE) if s.overlapped]
    assert {(s.op, s.mb, s.stage) for s in paired} == {("W", 1, 3), ("BW", 0, 0)}


def test_short_steps_are_measured_until_min_time_or_max_steps(p2):
    # steps of a few ms cannot fill 10 s: the cap, agreed by both ranks, decides
    assert len(p2["1f1b min time"].step_times) == 6
    assert len(p2["1f1b no lookahead, 2 steps"].step_times) == 2  # min_time 0: exactly `steps`
    check_exact(p2["1f1b min time"])


def test_min_time_is_checked():
    with pytest.raises(ValueError, match="min_time must be finite"):
        RunOptions(min_time=-1.0).checked()
    with pytest.raises(ValueError, match="max_steps"):
        RunOptions(steps=5, max_steps=4).checked()


def test_clock_offsets_on_one_host_are_small(p2):
    offsets = p2["1f1b clock ping"].trace.meta["clock_offsets"]
    assert offsets[0] == 0.0 and abs(offsets[1]) < 5e-3  # same clock: the estimate is ~0


def test_meta_has_calibration_facts(p2):
    meta = p2["zb-v m=4"].trace.meta
    assert meta["activation_bytes"] == [4 * 8 * 8] * 4  # (microbatch 4, hidden 8) float64 per boundary
    assert set(meta["op_time_mean"]) >= {"F@0", "B@0", "W@0"} and all(v > 0 for v in meta["op_time_mean"].values())
    assert all(v > 0 for v in meta["activation_memory"].values())
    assert len(meta["step_times"]) == 1 and meta["step_times"][0] > 0


def test_float32_tolerance(p2):
    worst = 0.0
    for case, result in p2.items():
        if "float32" in case:
            c = result.check
            assert c.grads_match and c.loss_matches and c.replicas_identical
            worst = max(worst, c.max_grad_rel_error, c.loss_rel_error)
    assert worst < 1e-6  # measured at most 2.2e-7 (README); the float32 check tolerance is 1e-5


def children() -> list[str]:
    """Command lines of this process's live children, but multiprocessing's resource tracker."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and "resource_tracker" not in cmdline:
            out.append(cmdline)
    return out


class Slow(nn.Module):
    """Sleeps before every forward after the first (the model check)."""

    def __init__(self, inner: nn.Module, delay: float):
        super().__init__()
        self.inner, self.delay, self.calls = inner, delay, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            time.sleep(self.delay)
        return self.inner(x)


class Crash(nn.Module):
    """Raises in its second forward: past the model check, inside the pipelined step."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise ValueError("injected failure")
        return self.inner(x)


def test_timeout_names_rank_op_and_peer():
    model = MLP64.build(2, 2)
    model.stages[1] = Slow(model.stages[1], 30.0)
    start = time.monotonic()
    with pytest.raises(ExecutorError) as info:
        launch_local(run_schedule, (build("1f1b", 2, 2), model, RunOptions(timeout=1.0, check=False)), 2,
                     timeout=1.0)
    assert time.monotonic() - start < 25, "the sleeping rank was killed, not waited for"
    assert str(info.value) == ("rank 0: timed out after 1 s in BW0@0 waiting for the gradient of BW0@1 "
                               "(for BW0@0) from rank 1")
    assert children() == []


def test_failing_rank_stops_every_rank():
    model = MLP64.build(4, 8)
    model.stages[2] = Crash(model.stages[2])
    start = time.monotonic()
    with pytest.raises(ExecutorError, match=r"^rank 2: ValueError: injected failure$"):
        launch_local(run_schedule, (build("1f1b", 4, 8), model, RunOptions(timeout=60, check=False)), 4,
                     timeout=60)
    assert time.monotonic() - start < 30, "the other ranks were stopped well before their timeout"
    assert children() == []


def test_cli_json_and_trace(tmp_path):
    out = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "pipesched", "run", "zb-v", "-p", "2", "-m", "4", "--hidden", "16",
                           "--steps", "2", "--warmup", "1", "--min-time", "0", "--json", "--trace", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("schedule", "backend", "ranks", "microbatches", "steps", "step_time_median", "makespan",
                "bubble_ratio", "per_rank", "max_grad_rel_error", "loss_matches_reference"):
        assert key in doc
    assert doc["loss_matches_reference"] is True and doc["steps"] == 2 and len(doc["per_rank"]) == 2
    trace = Trace.load(out)
    assert trace.source == "measured" and trace.meta["backend"] == "gloo"
    check_trace_file = compute_metrics(trace, validate(build("zb-v", 2, 4)))
    assert check_trace_file.makespan == pytest.approx(doc["makespan"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "pipesched", "run", "dualpipev", "-p", "2", "-m", "2",
           "--hidden", "8", "--dtype", "float64", "--steps", "1", "--warmup", "0", "--min-time", "0", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # never leave torchrun's ranks behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    doc = json.loads(out)  # rank 0 alone prints
    assert doc["ranks"] == 2 and doc["loss_matches_reference"] and doc["max_grad_rel_error"] < 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gloo_cuda_ranks_share_one_gpu():
    result = launch_local(run_cases, ([("zb-v", build("zb-v", 2, 4), MLP64, RunOptions())],), 2,
                          backend="gloo-cuda", timeout=120)["zb-v"]
    check_exact(result)
    check_trace(result, build("zb-v", 2, 4))
    assert all(x > 0 for x in result.trace.meta["cuda_max_memory_allocated"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_one_rank():
    n = min(torch.cuda.device_count(), 2)
    name = "1f1b" if n == 1 else "zb-v"
    result = launch_local(run_cases, ([(name, build(name, n, 4), MLP64, RunOptions())],), n, backend="nccl",
                          timeout=120)[name]
    check_exact(result)
    check_trace(result, build(name, n, 4))


def _sleep_then_return(ctx, seconds: float) -> int:
    time.sleep(seconds)
    return ctx.rank


def test_ranks_are_stopped_before_the_host_runs_out_of_memory(monkeypatch):
    from pipesched.executor import launch as launcher
    from pipesched.executor.comm import HostOutOfMemory

    monkeypatch.setattr(launcher, "MEMORY_RESERVE_FRACTION", 2.0)  # keep free more than the host has
    start = time.monotonic()
    with pytest.raises(HostOutOfMemory, match=r"^out of memory: the 2 ranks held .* GiB and .* GiB was left"):
        launch_local(_sleep_then_return, (60.0,), 2, timeout=60)
    assert time.monotonic() - start < 30, "stopped at the first reading, not after the ranks' sleep"
    assert HostOutOfMemory.exit_status == 2
    assert children() == []


def test_a_rank_killed_without_reporting_is_named_with_its_signal():
    from pipesched.executor.launch import _died

    assert _died(2, -9).startswith("rank 2 was killed by SIGKILL without reporting (the kernel's out-of-memory")
    assert _died(1, -15) == "rank 1 was killed by SIGTERM without reporting"
    assert _died(0, 3) == "rank 0 exited with status 3 without reporting"


def test_run_stopped_for_memory_is_one_line_and_exit_status_2(monkeypatch, capsys):
    from pipesched.cli import main
    from pipesched.executor import launch as launcher

    monkeypatch.setattr(launcher, "MEMORY_RESERVE_FRACTION", 2.0)
    assert main(["run", "1f1b", "-p", "2", "-m", "2", "--hidden", "16", "--steps", "1", "--min-time", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pipesched: error: out of memory: the 2 ranks held")
    assert children() == []
