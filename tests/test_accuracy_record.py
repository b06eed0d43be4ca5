"""The README's accuracy tables are what the saved runs give under today's simulator:
re-predicting every recorded case (calibrated costs and measured trace, saved by
`benchmarks/validation_accuracy.py --save-runs`) must print the recorded results. A
change to the simulator that moves them must re-record them (`--from-runs FILE >
RESULTS.txt`) and update the README."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def without_timing(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("took ")]


@pytest.mark.parametrize("runs, recorded", [
    ("validation_accuracy_runs.json.gz", "validation_accuracy.txt"),          # gloo on CPU, 108 cases
    ("validation_accuracy_gpu_runs.json.gz", "validation_accuracy_gpu.txt"),  # ranks sharing an H100
])
def test_saved_runs_reproduce_the_recorded_accuracy(runs, recorded):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validation_accuracy.py"), "--from-runs",
                           str(RESULTS / runs)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert without_timing(proc.stdout) == without_timing((RESULTS / recorded).read_text())
