"""docs/models.md's scripts run as printed (tiny sizes): from an nn.Module to schedule,
calibration, simulation, run, validation and plots; and the transformers example."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"


def scripts() -> list[str]:
    """The page's complete scripts: python blocks with a main guard."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return [b for b in blocks if 'if __name__ == "__main__":' in b]


def run_script(code: str, where: Path) -> str:
    path = where / "script.py"
    path.write_text(code)
    proc = subprocess.run([sys.executable, str(path)], cwd=where, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_page_has_two_scripts():
    assert len(scripts()) == 2


@pytest.mark.distributed
def test_module_to_validation_script_runs(tmp_path):
    out = run_script(scripts()[0], tmp_path)
    assert "loss matches: True" in out
    assert "reference check passed" in out  # torch's runtime, same model
    for name in ("costs.json", "predicted.png", "measured.png", "validate.png"):
        assert (tmp_path / name).stat().st_size > 0 and f"wrote {name}" in out


@pytest.mark.distributed
def test_transformers_script_runs(tmp_path):
    pytest.importorskip("transformers")
    out = run_script(scripts()[1], tmp_path)
    error = float(re.search(r"max gradient relative error (\S+)", out).group(1))
    assert error < 1e-5
