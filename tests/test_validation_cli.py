"""`pipesched calibrate` and `pipesched validate` end to end on gloo (p = 2, a small
model): the report's fields, loose accuracy bounds (CI machines are noisy), the files
written, and bad input refused before any process starts."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipesched.executor.run_calibration import RUN_STEPS  # noqa: E402
from pipesched.simulator.cost_file import load  # noqa: E402
from pipesched.simulator.trace import Trace  # noqa: E402

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--hidden", "256", "--microbatch-size", "32", "--repeats", "5", "--calibration-warmup", "2"]


def pipesched(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipesched", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})


def test_validate_reports_predicted_against_measured(tmp_path):
    # no --out: a new folder in the temporary directory, announced on stderr beside --json
    proc = pipesched("validate", "zb-h1", "-p", "2", "-m", "8", *SMALL, "--steps", "5", "--warmup", "2",
                     "--json", "--replay", env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (folder,) = [p for p in tmp_path.iterdir()]
    assert folder.name.startswith("pipesched-validate-") and f"wrote {folder}" in proc.stderr
    tmp_path = folder
    for key in ("schedule", "predicted", "measured", "makespan_rel_error", "bubble_abs_error",
                "start_time_error_p50", "start_time_error_p90", "peak_memory_rel_error", "per_rank", "per_op",
                "replay_makespan_rel_error", "replay"):
        assert key in doc, key
    # the replay uses the run's own op and transfer times (its accuracy is measured by
    # benchmarks/accuracy_random.py on a quiet machine; host time a busy machine steals is not in them)
    assert abs(doc["replay_makespan_rel_error"]) < 0.3 and doc["replay"]["transfers_replayed"]
    assert [r["rank"] for r in doc["replay"]["per_rank"]] == [0, 1]
    assert Trace.load(tmp_path / "replay.json").meta["replay"] == "task"
    for side in ("predicted", "measured"):
        assert {"makespan", "bubble_ratio", "per_rank"} <= set(doc[side])
    assert doc["schedule"] == "zb-h1" and len(doc["per_rank"]) == 2 and doc["loss_matches_reference"]
    # the measurement against itself, beside the error: even steps' median against the odd ones'
    steps = doc["measured_makespans"]
    assert len(steps) >= 5
    assert doc["measured_halves_apart"] == pytest.approx(abs(statistics.median(steps[0::2])
                                                             / statistics.median(steps[1::2]) - 1))
    assert 0 <= doc["measured_steps_spread"] < 1
    # loose bounds: the prediction is in the right place even on a busy machine
    assert abs(doc["makespan_rel_error"]) < 0.3, doc["makespan_rel_error"]
    assert doc["bubble_abs_error"] < 0.15
    assert abs(doc["peak_memory_rel_error"]) < 0.1
    assert 0 <= doc["start_time_error_p50"] <= doc["start_time_error_p90"] < 0.3
    predicted, measured = Trace.load(tmp_path / "predicted.json"), Trace.load(tmp_path / "measured.json")
    assert predicted.source == "simulated" and measured.source == "measured"
    assert (tmp_path / "validate.png").stat().st_size > 10_000
    costs = load(tmp_path / "costs.json")
    assert len(costs.model_stages) == 2 and costs.model_stages[0].activation_bytes == 32 * 256 * 4
    # ZB-H1 is also one of the calibration's runs: this run against that one, two runs of one schedule
    split, seconds = costs.meta["from_runs"]["typical_steps"]["zb-h1"]
    # like for like: the median of this run's steps over the median of that run's
    assert split == 2 and doc["calibration_run_apart"] == pytest.approx(
        statistics.median(doc["measured_makespans"]) / seconds - 1)
    # the cost file drives the simulator as any other
    sim = pipesched("simulate", "zb-h1", "-p", "2", "-m", "8", "--costs", str(tmp_path / "costs.json"), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["makespan"] == pytest.approx(doc["predicted"]["makespan"], rel=1e-9)


@pytest.mark.gpu
def test_validate_ranks_sharing_one_gpu(tmp_path):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    proc = pipesched("validate", "1f1b", "-p", "2", "-m", "4", "--backend", "gloo-cuda", "--hidden", "2048",
                     "--microbatch-size", "64", "--repeats", "5", "--json", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["shared_compute"] and doc["host"]["gpu"] and doc["loss_matches_reference"]
    costs = load(tmp_path / "costs.json")
    # posting and taking a transfer are host work: timed after the op's kernels finished,
    # they no longer include the op (before the fix, taking one cost as much as a W)
    op = min(s.forward for s in costs.model_stages)
    assert costs.host_overhead.per_take < op and costs.host_overhead.per_send < op
    assert abs(doc["makespan_rel_error"]) < 0.5  # shared-GPU predictions are rough (README)


def test_calibrate_writes_a_cost_file(tmp_path):
    out = tmp_path / "costs.json"
    proc = pipesched("calibrate", "zb-v", "-p", "2", "-m", "4", *SMALL, "--op-times", "runs", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "T_F" in proc.stdout and "link: latency" in proc.stdout and "to post a send" in proc.stdout
    # progress, on stderr; ZB-H1 runs the same network in p model stages: the ops' fixed times
    assert "calibrating: op times from 5 steps of interleaved-1f1b, zb-v, zb-h1" in proc.stderr
    costs = load(out)
    assert len(costs.model_stages) == 4  # zb-v cuts the model in 2p
    # op times from every measured step of the runs of interleaved 1F1B (BW) and ZB-V (B, W): 4 F per model
    # stage, run and step
    assert costs.meta["from_runs"] == {**costs.meta["from_runs"], "schedules": ["interleaved-1f1b", "zb-v", "zb-h1"]}
    assert costs.meta["from_runs"]["steps"] == 3 * RUN_STEPS
    assert costs.meta["from_runs"]["samples"] == RUN_STEPS * (4 * (4 + 4) + 4 * (4 + 4 + 4)) and costs.host is None
    assert all(s.forward > 0 and s.backward_weight > 0 and s.activation_memory > 0 for s in costs.model_stages)
    link = costs.network.intra
    assert link.latency >= 0 and 1e8 < link.bandwidth < float("inf")  # loopback: GB/s
    # host time fitted to the runs' gaps between ops: no term below 0, and any one may fit to 0
    # (non-negative least squares), but not all of them: the gaps are there
    o = costs.host_overhead
    terms = (o.per_op, o.per_send, o.per_recv, o.per_take)
    assert costs.meta["host_from_run"]["gaps"] > 0 and costs.meta["host_from_run"]["median_gap"] > 0
    assert min(terms) >= 0 and sum(terms) > 0
    # the executor's sum of shared gradients, timed on a small tensor and on once and twice
    # the biggest model stage's parameters, and the line fitted to it
    timed = costs.meta["calibrated"]["gradient_sum"]
    biggest = max(s.param_bytes for s in costs.model_stages)
    assert timed["sizes"] == [4096, biggest, 2 * biggest] and min(timed["seconds"]) > 0
    assert costs.gradient_sum is not None and costs.gradient_sum.per_byte > 0


@pytest.mark.parametrize("args, message", [
    (["calibrate", "1f1b", "-p", "2", "-m", "4", "-o", "/nonexistent/c.json"], "cannot write"),
    (["calibrate", "1f1b", "-p", "2", "-m", "4", "-o", "c.json", "--repeats", "0"], "--repeats"),
    (["calibrate", "1f1b", "-p", "2", "-m", "4", "-o", "c.json", "--hidden", "0"], "--hidden"),
    (["validate", "dualpipe", "-p", "3", "-m", "4"], "even number of ranks"),
    (["validate", "1f1b", "-p", "2", "-m", "4", "--steps", "0"], "--steps"),
    (["validate", "1f1b", "-p", "2", "-m", "4", "--backend", "nccl"], "CUDA"),
    (["validate", "1f1b", "-p", "2", "-m", "4", "--out", "/proc/x"], "cannot create --out"),
    (["validate", "1f1b,1f1b", "-p", "2", "-m", "4"], "distinct names"),
    (["validate", "1f1b,zb-h1", "-p", "2", "-m", "4", "--dp", "2"], "without --dp"),
    (["validate", "1f1b,nosuch", "-p", "2", "-m", "4"], "unknown schedule 'nosuch'"),
    (["validate", "1f1b", "-p", "2", "-m", "4", "--dp", "2", "--step-barrier", "none"], "without --dp"),
    (["validate", "1f1b,zb-v", "-p", "2", "-m", "4", "--layers-per-stage", "3"], "blocks halve"),
    # 596 GiB of parameters a model stage: refused before anything is allocated
    (["validate", "1f1b", "-p", "2", "-m", "4", "--hidden", "100000"], "parameters and gradients need about"),
    (["calibrate", "zb-h1", "-p", "2", "-m", "4", "-o", "c.json", "--hidden", "100000"], "GiB are available"),
])
def test_bad_input_is_refused_in_one_line_before_launch(args, message, tmp_path):
    if "--backend" in args:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    proc = pipesched(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_validate_several_schedules_from_one_calibration(tmp_path):
    # one launch: one calibration predicts all three, their runs take their steps in turn;
    # ZB-V (v = 2) runs the same network cut in twice as many model stages
    proc = pipesched("validate", "1f1b,zb-h1,zb-v", "-p", "2", "-m", "4", *SMALL, "--steps", "3", "--warmup", "1",
                     "--json", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "in turn with 1f1b, zb-h1, zb-v's" in proc.stderr
    assert [s["schedule"] for s in doc["schedules"]] == ["1f1b", "zb-h1", "zb-v"]
    predicted = {s["schedule"]: s["predicted"]["makespan"] for s in doc["schedules"]}
    measured = {s["schedule"]: s["measured"]["makespan"] for s in doc["schedules"]}
    ranking = doc["ranking"]
    assert ranking["predicted"] == sorted(predicted, key=predicted.get)
    assert ranking["measured"] == sorted(measured, key=measured.get)
    assert ranking["pick_over_fastest"] == pytest.approx(
        measured[ranking["predicted_fastest"]] / measured[ranking["measured_fastest"]] - 1)
    sure = ranking["confidence"]  # the predicted lead against the error known for those schedules
    assert sure["pick"] == ranking["predicted_fastest"] and sure["runner_up"] == ranking["predicted"][1]
    assert sure["gap"] == pytest.approx(predicted[sure["runner_up"]] / predicted[sure["pick"]] - 1)
    assert sure["settled"] == (sure["gap"] > sure["error"]) and sure["to_measure"][0] == sure["pick"]
    for s in doc["schedules"]:
        assert abs(s["makespan_rel_error"]) < 0.3 and s["loss_matches_reference"], s["schedule"]
        assert len(s["measured_makespans"]) >= 3 and (tmp_path / s["schedule"] / "validate.png").exists()
    # one cost model for all: every schedule's saved costs are the same calibration
    costs = [load(tmp_path / name / "costs.json") for name in predicted]
    assert costs[0] == costs[1] == costs[2] and len(costs[0].model_stages) == 2
    # all three were also calibration runs (ZB-V at the other split): each measured twice in
    # this launch, and the further apart of those pairs is a floor under the pick's error
    typical = costs[0].meta["from_runs"]["typical_steps"]
    assert {name: split for name, (split, _) in typical.items()} == {"1f1b": 2, "zb-h1": 2, "zb-v": 4}
    again = ranking["measured_again"]
    steps = {s["schedule"]: statistics.median(s["measured_makespans"]) for s in doc["schedules"]}
    assert again == pytest.approx({name: steps[name] / typical[name][1] - 1 for name in steps})
    halves = ranking["measured_halves"]  # each run's even steps against its odd ones, a floor too
    assert halves == pytest.approx({s["schedule"]: s["measured_halves_apart"] for s in doc["schedules"]})
    assert sure["floor"] == pytest.approx(max([abs(v) for v in again.values()] + list(halves.values())))
    assert sure["error"] >= sure["floor"]
    assert "measured again: 1f1b " in pipesched("validate", "1f1b,zb-h1", "-p", "2", "-m", "4", *SMALL, "--steps",
                                                "2", "--warmup", "1", "--out", str(tmp_path / "text")).stdout


def test_validate_without_a_barrier_compares_and_ranks_by_period(tmp_path):
    # each schedule's steps run once more back to back; the period predicted is the
    # simulator's for steps without a barrier under the same calibrated costs
    proc = pipesched("validate", "1f1b,zb-h2", "-p", "2", "-m", "4", *SMALL, "--steps", "4", "--warmup", "1",
                     "--step-barrier", "none", "--json", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ranking"]["by"] == "period"
    measured = {}
    for s in doc["schedules"]:
        q = s["period"]
        assert q["steps"] >= 4 and q["measured"] > 0 and abs(q["rel_error"]) < 0.4, q
        assert q["rel_error"] == pytest.approx(q["predicted"] / q["measured"] - 1)
        measured[s["schedule"]] = q["measured"]
    # (1f1b: its order does not depend on the costs, which simulate --costs may use to build zb-h2)
    sim = pipesched("simulate", "1f1b", "-p", "2", "-m", "4", "--costs", str(tmp_path / "1f1b" / "costs.json"),
                    "--step-barrier", "none", "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["period"] == pytest.approx(doc["schedules"][0]["period"]["predicted"], rel=1e-9)
    assert doc["ranking"]["measured"] == sorted(measured, key=measured.get)


def test_validate_measures_ten_steps_by_default_and_run_five():
    from pipesched.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["validate", "1f1b", "-p", "2", "-m", "4"]).steps == 10
    assert parse(["run", "1f1b", "-p", "2", "-m", "4"]).steps == 5
    assert parse(["validate", "1f1b", "-p", "2", "-m", "4", "--steps", "3"]).steps == 3


def test_validate_many_from_python_splits_the_network_for_each_schedule():
    import pipesched as ps

    model = ps.ExampleModel(hidden=128, layers_per_stage=2, microbatch_size=16)
    schedules = [ps.build("gpipe", 2, 4), ps.build("interleaved-1f1b", 2, 4)]
    got = ps.validate_many(schedules, model, ps.RunOptions(steps=2, warmup=1),
                           ps.CalibrationOptions(repeats=3, warmup=1))
    assert [v.measured.schedule for v in got] == ["gpipe", "interleaved-1f1b"]
    assert got[0].costs == got[1].costs  # one calibration
    assert all(v.run.check.loss_matches and v.run.check.grads_match for v in got)
    # the same network of four blocks: interleaved 1F1B's four model stages hold one each
    assert "layers_per_stage=2" in got[0].measured.meta["model"]
    assert "layers_per_stage=1" in got[1].measured.meta["model"]
