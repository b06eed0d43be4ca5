"""benchmarks/gpu_check.py: the budget logic, and its dry run end to end (gloo on CPU)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _check(gc, tmp_path, total, estimates, clock):
    budget = gc.Budget(total, estimates, clock)
    return gc.Check(gc.DRY, budget, gc.Recorder(tmp_path, budget), tmp_path)


def test_steps_that_do_not_fit_are_skipped(tmp_path):
    gc = _module()
    clock = FakeClock()
    check = _check(gc, tmp_path, 30 + gc.RESERVE, {"run": 10, "layer": 5, "torch-runtime": 40}, clock)
    ran, limits = [], []

    def action(name, seconds):
        def act(chk, timeout):
            ran.append(name)
            limits.append(timeout)
            clock.t += seconds
            chk.rec.write("x", name, "ok")
        return act

    steps = [gc.Step("run", "a", action("a", 10)), gc.Step("run", "b", action("b", 12)),
             gc.Step("run", "c", action("c", 1)), gc.Step("layer", "l", action("l", 5)),
             gc.Step("torch-runtime", "t", action("t", 1))]
    gc.run_steps(check, steps)
    check.rec.close()
    # torch-runtime (40 s) never fits, so it keeps nothing back; a (10 s) runs, keeping 5 s for the
    # layer; b (12 s, 20 s left) runs; c (estimate: the median of a and b, 11 s) does not fit in
    # the 8 s left with 5 kept for the layer, which then runs; 3 s are left for neither c nor t
    assert ran == ["a", "b", "l"]
    assert limits[:2] == [25, pytest.approx(15)]  # never into the 5 s kept for the layer
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    skipped = [(x["name"], x["estimate"]) for x in lines if x["status"] == "skipped"]
    assert skipped == [("c", 11), ("t", 42)]  # 40 s x 1.05: runs took 1.1 x their default, the layer 1 x
    assert "skipped" in gc.summary(check.rec.records)


def test_steps_put_off_run_at_the_end_when_time_is_left(tmp_path):
    gc = _module()
    clock = FakeClock()
    check = _check(gc, tmp_path, 50 + gc.RESERVE, {"run": 25, "validate": 30}, clock)
    ran = []

    def action(name, seconds):
        def act(chk, timeout):
            ran.append(name)
            clock.t += seconds
            chk.rec.write("x", name, "ok")
        return act

    # a runs first (25 + 30 s would not fit, so nothing is kept for validate); then b would
    # leave less than validate's 30 s: put off; v runs (5 s), and b runs at the end
    gc.run_steps(check, [gc.Step("run", "a", action("a", 20)), gc.Step("run", "b", action("b", 20)),
                         gc.Step("validate", "v", action("v", 5))])
    assert ran == ["a", "v", "b"]
    assert not [r for r in check.rec.records if r["status"] == "skipped"]


def test_room_is_kept_for_the_later_kinds_that_fit_in_order():
    gc = _module()
    budget = gc.Budget(20 + gc.RESERVE, {"run": 5, "validate": 12, "layer": 10, "torch-runtime": 8}, FakeClock())
    steps = [gc.Step(k, k, None) for k in ("run", "run", "validate", "layer", "torch-runtime")]
    # run 5, validate 12 (17), layer would make 27: not kept; torch-runtime 8 would make 25: not kept
    assert gc.kept_for_later(budget, steps, 0, set()) == 12
    assert gc.kept_for_later(budget, steps, 1, {"run"}) == 12 + 8     # validate 12, layer 22 no, torch 20
    assert gc.kept_for_later(budget, steps, 3, {"run", "validate"}) == 8


def test_later_kinds_keep_room_and_slowness_scales_estimates():
    gc = _module()
    clock = FakeClock()
    budget = gc.Budget(100, {"run": 5, "validate": 20}, clock)
    assert budget.fits("run", kept=20)
    assert not budget.fits("run", kept=95)
    budget.spent("run", 10)            # twice as slow as its default: validate is estimated 2 x 20 s
    assert budget.estimate("validate") == 40
    budget.spent("setup", 1000)        # setup (installing) does not count
    assert budget.estimate("validate") == 40
    assert budget.timeout("run") == 40                  # 3 x 10 s, at least 30 s more
    assert budget.timeout("run", kept=70) == pytest.approx(30 - gc.RESERVE)
    clock.t = 90
    assert budget.timeout("run") == pytest.approx(10 - gc.RESERVE)


def test_a_failing_step_is_recorded_and_the_next_runs(tmp_path):
    gc = _module()
    check = _check(gc, tmp_path, 100, {"run": 1}, FakeClock())

    def broken(chk, timeout):
        raise RuntimeError("boom")

    gc.run_steps(check, [gc.Step("run", "x", broken),
                         gc.Step("run", "y", lambda chk, t: chk.rec.write("run", "y", "ok"))])
    assert [(r["name"], r["status"]) for r in check.rec.records] == [("x", "error"), ("y", "ok")]
    assert "boom" in check.rec.records[0]["error"]
    assert "error" in gc.summary(check.rec.records)


@pytest.mark.distributed
def test_dry_run_measures_every_step_kind(tmp_path):
    """The command the brief names, on gloo at tiny sizes: about 45 s on 2 idle cores. Its
    budget is an upper bound: under a load of 4 the steps run 2-3x their estimates, so a
    110 s budget skipped torch's runtime; 240 s keeps one of each kind there."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "--dry-run", "--budget", "240"], cwd=ROOT,
                          capture_output=True, text=True, timeout=320)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    ok = {x["kind"] for x in lines if x["status"] == "ok"}
    assert {*_module().KINDS, "end"} <= ok, \
        [(x["kind"], x["name"], x["status"]) for x in lines]
    runs = {x["name"]: x for x in lines if x["kind"] == "run"}
    assert set(runs) == set(_module().DRY_SCHEDULES)
    ran = [x for x in runs.values() if x["status"] != "skipped"]  # a loaded machine may skip some
    assert all(x["status"] == "ok" and x["loss_matches_reference"] for x in ran), runs
    validated = [x for x in lines if x["kind"] == "validate" and "predicted_makespan" in x]
    assert validated and all(x["replay_makespan_rel_error"] is not None for x in validated)
    assert all(x["forward_s"] > 0 and x["activation_memory_bytes"] > 0 for x in lines
               if x["kind"] == "layer" and x["status"] == "ok")
    assert lines[-1]["kind"] == "end"
    assert "kind" in proc.stdout and "torch-runtime" in proc.stdout  # the summary table
    assert (out / "summary.txt").read_text().startswith("kind")
    assert "$ " in (out / "raw.log").read_text()
    assert (out / "artifacts.tar.gz").stat().st_size > 0
    assert took < 280, took
