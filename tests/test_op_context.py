"""benchmarks/op_context.py: measured op times against predicted, by what ran before each op."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, StageCost

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "op_context.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_each_op_is_held_against_the_same_op_of_the_prediction_by_its_context(tmp_path):
    # "measured": forwards 20 % shorter than predicted, backwards as predicted
    predicted = simulate(build("gpipe", 2, 4), CostModel(stages=(StageCost(1.0, 1.0, 1.0),)))
    measured = simulate(build("gpipe", 2, 4), CostModel(stages=(StageCost(0.8, 1.0, 1.0),)))
    folder = tmp_path / "model0" / "gpipe"
    folder.mkdir(parents=True)
    predicted.save(folder / "predicted.json")
    replace(measured, source="measured").save(folder / "measured.json")
    out = run(str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.stdout.splitlines()
            if line.startswith(("gpipe ", "all "))}
    # GPipe on each rank: F F F F BW BW BW BW: one first F, three repeated; the first BW
    # follows an F of its stage, three repeat
    assert rows[("gpipe", "F")] == ["0.800", "(", "2)", "0.800", "(", "6)", "-", "-"]
    assert rows[("gpipe", "BW")] == ["-", "1.000", "(", "6)", "1.000", "(", "2)", "-"]
    # by place in a run of its kind and stage: each rank's four forwards are its 1st to
    # 4th, its four backwards likewise
    places = {line.split()[0]: line.split()[1:] for line in out.stdout.split("by the op's place")[1].splitlines()[2:4]}
    assert places["F"] == ["0.800", "(", "2)"] * 4 + ["-"]
    assert places["BW"] == ["1.000", "(", "2)"] * 4 + ["-"]
    # compute 22.4 s against 24 s; makespan 15 s predicted against 14 s
    assert "gpipe             -6.7%/+7.1%" in out.stdout


def test_a_folder_without_runs_is_one_line_and_exit_2(tmp_path):
    out = run(str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "no predicted.json beside a measured.json" in out.stderr


def test_replay_by_kind_recovers_a_run_whose_forwards_took_longer_than_predicted(tmp_path):
    from pipesched.simulator.cost_file import save

    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    predicted = simulate(build("gpipe", 2, 4), costs)
    measured = simulate(build("gpipe", 2, 4), CostModel(stages=(StageCost(1.5, 1.0, 1.0),)))
    folder = tmp_path / "gpipe"
    folder.mkdir()
    predicted.save(folder / "predicted.json")
    replace(measured, source="measured").save(folder / "measured.json")
    save(costs, folder / "costs.json")
    out = run(str(tmp_path), "--replay")
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("gpipe ") and "runs)" in line]
    # GPipe, p = 2, m = 4: (m + p - 1)(F + BW), 15 s predicted against 17.5 s measured;
    # replayed with the run's own op times, per task and per kind, the run itself
    assert row[1:4] == [f"{15 / 17.5 - 1:+.1%}", "+0.0%", "+0.0%"]
