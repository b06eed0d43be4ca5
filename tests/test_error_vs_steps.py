"""benchmarks/error_vs_steps.py: a makespan error against the median of fewer steps."""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the script reads steps as the executor reports them

from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.api import simulate  # noqa: E402
from pipesched.simulator.costs import CostModel, StageCost  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402

from helpers import benchmark_module  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "error_vs_steps.py"
error_vs_steps = benchmark_module("error_vs_steps")


def test_windows_hold_the_prediction_against_each_run_of_k_steps_median():
    # steps 1, 3, 1, 3: every window of 2 has lower median 1 -> error 1.0 for a prediction of 2
    assert error_vs_steps.window_errors(2.0, [1.0, 3.0, 1.0, 3.0], 2) == pytest.approx(1.0)
    # windows of 3: lower medians 1, 3 -> errors 1.0 and 1/3, mean 2/3
    assert error_vs_steps.window_errors(2.0, [1.0, 3.0, 1.0, 3.0], 3) == pytest.approx((1.0 + 1 / 3) / 2)
    assert error_vs_steps.window_errors(2.0, [1.0, 3.0], 3) is None


def test_the_fit_recovers_the_floor_and_the_noise_per_step():
    a, b = 0.02, 0.12
    points = [(k, math.sqrt(a * a + b * b / k)) for k in (2, 5, 10, 40)]
    assert error_vs_steps.floor_fit(points) == pytest.approx((a, b))
    # pure noise: the floor is zero
    fa, fb = error_vs_steps.floor_fit([(k, b / math.sqrt(k)) for k in (2, 5, 10)])
    assert fa == pytest.approx(0.0, abs=1e-9) and fb == pytest.approx(b)
    assert error_vs_steps.floor_fit([(10, 0.03)]) is None


def test_the_command_reads_validate_folders_and_refuses_an_empty_one(tmp_path):
    predicted = simulate(build("gpipe", 2, 4), CostModel(stages=(StageCost(1.0, 1.0, 1.0),)))
    folder = tmp_path / "model0" / "gpipe"
    folder.mkdir(parents=True)
    predicted.save(folder / "predicted.json")
    span = compute_metrics(predicted).makespan  # every measured step as predicted: no error at any k
    measured = replace(predicted, source="measured", meta={**predicted.meta, "makespans": [span] * 10})
    measured.save(folder / "measured.json")
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "others: k=2: 0.00 % (1)" in out.stdout and "k=10: 0.00 % (1)" in out.stdout
    empty = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none")], capture_output=True, text=True,
                           timeout=120)
    assert empty.returncode == 2 and "no predicted.json" in empty.stderr
