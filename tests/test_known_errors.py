"""benchmarks/known_errors.py: the signed record of each schedule's error, and how the rule
built on it holds on launches it was not fitted on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "known_errors.py"
sys.path.insert(0, str(SCRIPT.parent))

from known_errors import bias_ceiling, fitted_table, followed  # noqa: E402


def launch(predicted: dict[str, float], measured: dict[str, float], again: dict[str, float] | None = None) -> dict:
    """A launch's document as validate_many's kept_doc gives it (the fields read here)."""
    return {"schedules": [{"schedule": n, "predicted": {"makespan": predicted[n]}, "measured": {"makespan": measured[n]},
                           "calibration_run_apart": (again or {}).get(n)} for n in predicted],
            "ranking": {"shared_cores": False}}


def test_the_fitted_record_is_each_schedules_signed_quantiles():
    errors = {(False, "dualpipe"): [-0.10, -0.05, 0.0, 0.01, 0.02], (True, "1f1b"): [0.03]}
    table = fitted_table(errors, 0.25)
    assert table["dualpipe"][0] == pytest.approx((-0.05, 0.01))
    assert table["1f1b"][1] == pytest.approx((0.03, 0.03))
    assert table["dualpipe"][1] == pytest.approx(fitted_table({}, 0.25)["dualpipe"][1])  # no run: today's entry


def test_the_bias_ceiling_takes_each_schedules_median_out():
    # ZB-V always 4 % long: a per-schedule correction would remove all of its error
    whole, centred = bias_ceiling({"zb-v": [0.04, 0.04, 0.04], "1f1b": [-0.01, 0.0, 0.01]})
    assert whole == pytest.approx(0.025) and centred == pytest.approx(0.0)
    assert bias_ceiling({}) == (0.0, 0.0)


def test_following_the_command_measures_what_it_names_and_keeps_a_settled_pick():
    record = {"1f1b": ((-0.02, 0.02), (-0.02, 0.02)), "dualpipe": ((-0.10, 0.02), (-0.10, 0.02)),
              "gpipe": ((-0.02, 0.02), (-0.02, 0.02))}
    # DualPipe predicted 8 % ahead of 1F1B but known to come out up to 10 % short: not settled,
    # both named, and a user who measures them ends with 1F1B, the fastest
    doc = launch({"dualpipe": 1.0, "1f1b": 1.08, "gpipe": 1.5}, {"dualpipe": 1.12, "1f1b": 1.05, "gpipe": 1.4})
    assert followed(doc, record) == (False, 0.0, 2)
    # 1F1B 8 % ahead of DualPipe is settled (1.02 / 0.98); trusting it costs what it measured
    doc = launch({"1f1b": 1.0, "dualpipe": 1.08, "gpipe": 1.5}, {"1f1b": 1.05, "dualpipe": 1.00, "gpipe": 1.4})
    assert followed(doc, record) == (True, pytest.approx(0.05), 1)
    # the launch's own floor (two runs of one schedule 9 % apart) unsettles it
    doc = launch({"1f1b": 1.0, "dualpipe": 1.08, "gpipe": 1.5}, {"1f1b": 1.05, "dualpipe": 1.00, "gpipe": 1.4},
                 again={"1f1b": -0.09})
    assert followed(doc, record) == (False, 0.0, 2)


def test_a_folder_without_kept_launches_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no kept folders" in out.stderr
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--quantile", "0.7"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--quantile must be between 0 and 0.5" in out.stderr


def test_a_kept_folder_that_cannot_be_read_is_one_line_and_exit_2(tmp_path):
    run = tmp_path / "p2-model0" / "1f1b"
    run.mkdir(parents=True)
    (run / "measured.json").write_text("{not json")
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "could not be read" in out.stderr
