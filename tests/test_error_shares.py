"""benchmarks/error_shares.py: a prediction's error split into the step residual, op times, noise, placement and the rest."""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.cost_file import save
from pipesched.simulator.costs import CostModel, StageCost

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "error_shares.py"
sys.path.insert(0, str(SCRIPT.parent))

from error_shares import SHARES, shares  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def kept_run(folder: Path, name: str, costs: CostModel, measured_costs: CostModel, **noise) -> None:
    folder.mkdir(parents=True)
    schedule = build(name, 2, 4)
    simulate(schedule, costs).save(folder / "predicted.json")
    replace(simulate(schedule, measured_costs, **noise), source="measured").save(folder / "measured.json")
    save(costs, folder / "costs.json")


def test_forwards_longer_than_calibrated_are_the_op_times_share_and_the_residual_its_own(tmp_path):
    # the cost model: F 1 s, B 1 s, W 1 s (BW 2 s), scaled by a step residual of 1.1;
    # the run: forwards 1.5 s. GPipe, p = 2, m = 4: (m + p - 1)(F + BW) = 15 s predicted
    # (residual included), 13.64 s without it, 17.5 s measured
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),), meta={"from_runs": {"residual": 1.1}})
    kept_run(tmp_path / "model0" / "gpipe", "gpipe", costs, CostModel(stages=(StageCost(1.5, 1.0, 1.0),)))
    out = run(str(tmp_path))
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("gpipe ")]
    assert row[1:] == [f"{15 / 17.5 - 1:+.2%}", "+10.00%", f"{15 / 1.1 / 17.5 - 1:+.2%}", "+0.00%", "+0.00%",
                       "+0.00%", "+0.00%", "1"]


def test_noisy_ops_lengthen_the_step_and_the_shares_multiply_to_the_error():
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    schedule = build("1f1b", 2, 8)
    measured = simulate(schedule, costs, noise_cv=0.4, rng=np.random.default_rng(3))
    found = shares(validate(schedule), costs, measured, np.random.default_rng(0))
    assert found["rest"] == pytest.approx(0.0, abs=1e-9)  # the simulator replays its own run exactly
    assert found["residual"] == 0.0  # no residual in these costs
    assert found["noise"] < 0  # a step over noisy ops is longer than over their means
    assert math.prod(1 + found[s] for s in SHARES[1:]) == pytest.approx(1 + found["error"], rel=1e-12)


def test_a_folder_without_costs_is_one_line_and_exit_2(tmp_path):
    folder = tmp_path / "gpipe"
    folder.mkdir()
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    simulate(build("gpipe", 2, 4), costs).save(folder / "predicted.json")
    simulate(build("gpipe", 2, 4), costs).save(folder / "measured.json")
    out = run(str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "no costs.json" in out.stderr


def test_a_run_of_another_schedule_is_skipped_with_its_reason(tmp_path):
    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    kept_run(tmp_path / "gpipe", "gpipe", costs, costs)
    kept_run(tmp_path / "m" / "zb-h1", "1f1b", costs, costs)  # a 1F1B run filed as ZB-H1
    out = run(str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "zb-h1: skipped" in out.stderr and "gpipe " in out.stdout and "zb-h1 " not in out.stdout


def test_a_slow_core_shows_in_the_same_ops_of_dualpipes_two_copies():
    from error_shares import core_ratio

    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    schedule = build("dualpipe", 2, 4)
    trace = simulate(schedule, costs)
    slow = trace.rank == 1  # every op of rank 1 half again as long
    trace = replace(trace, end=np.where(slow, trace.start + 1.5 * (trace.end - trace.start), trace.end))
    assert core_ratio(validate(schedule), costs, trace) == pytest.approx(1 / 1.5)
    # 1F1B holds each model stage on one rank only: nothing to compare
    one_copy = build("1f1b", 2, 4)
    assert core_ratio(validate(one_copy), costs, simulate(one_copy, costs)) is None
