"""The pipesched command line for schedules and simulation: outputs and exit codes."""
import json
import re
import subprocess
import sys

import pytest

from pipesched.cli import main
from pipesched.schedules import fileformat
from pipesched.schedules.registry import BUILDERS, build


def cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_names_every_schedule_and_its_constraints(capsys):
    code, out, _ = cli(capsys, "list")
    assert code == 0
    for name in BUILDERS:
        assert name in out
    assert "p even, m even" in out


def test_show_prints_a_grid_and_json_round_trips(capsys, tmp_path):
    code, out, _ = cli(capsys, "show", "zb-v", "-p", "2", "-m", "3")
    assert code == 0 and "rank 1" in out and "W2@2" in out
    code, out, _ = cli(capsys, "show", "dualpipe", "-p", "4", "-m", "8", "--json")
    assert fileformat.loads(out) == build("dualpipe", 4, 8)
    path = tmp_path / "mine.json"
    path.write_text(out)
    code, out2, _ = cli(capsys, "show", str(path))
    assert code == 0 and "dualpipe" in out2


def test_simulate_json_has_the_documented_fields(capsys):
    code, out, _ = cli(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--f", "1", "--b", "1", "--w", "1", "--json")
    data = json.loads(out)
    for key in ("schedule", "ranks", "microbatches", "makespan", "bubble_ratio", "per_rank", "comm_time",
                "comm_hidden_fraction", "critical_path"):
        assert key in data
    assert data["makespan"] == 33
    assert set(data["per_rank"][0]) >= {"rank", "busy", "idle", "bubble_ratio", "peak_memory_bytes"}


def test_simulate_a_file_with_costs_and_stochastic_runs(capsys, tmp_path):
    fileformat.save(build("zb-h1", 2, 4), tmp_path / "s.json")
    (tmp_path / "c.toml").write_text('format = "pipesched.costs/1"\n[stage]\nforward = 0.001\n'
                                     'backward_input = 0.002\nbackward_weight = 0.001\n')
    code, out, _ = cli(capsys, "simulate", str(tmp_path / "s.json"), "--costs", str(tmp_path / "c.toml"),
                       "--runs", "20", "--cv", "0.1", "--json", "--trace", str(tmp_path / "t.json"))
    data = json.loads(out)
    assert code == 0 and data["stochastic"]["runs"] == 20
    assert data["stochastic"]["p95"] >= data["stochastic"]["p50"]
    assert json.loads((tmp_path / "t.json").read_text())["format"] == "pipesched.trace/1"
    code, out, _ = cli(capsys, "simulate", str(tmp_path / "s.json"), "--costs", str(tmp_path / "c.toml"))
    assert "makespan" in out and "critical path" in out


@pytest.mark.parametrize("args,message", [
    (["simulate", "nope", "-p", "2", "-m", "2"], "unknown schedule 'nope'"),
    (["simulate", "dualpipe", "-p", "3", "-m", "6"], "even number of ranks, got 3"),
    (["simulate", "1f1b", "-p", "2"], "needs -p RANKS and -m MICROBATCHES"),
    (["simulate", "1fb1"], "unknown schedule '1fb1'; built-in schedules are"),
    (["simulate", "1f1b", "-p", "two", "-m", "2"], "invalid int value"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--f", "-1"], "forward must be finite and >= 0"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--bandwidth", "0"], "bandwidth must be > 0"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--costs", "/no/such.json"], "cannot read cost file"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--runs", "0"], "--runs must be between 1 and"),
    (["simulate", "/no/such.json"], "cannot read schedule file"),
    (["show", "zb-v", "-p", "2", "-m", "4", "-v", "3"], "2 chunks per rank"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = cli(capsys, *args)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


PREFIX = re.compile(r"pipesched(?: [a-z-]+)?: ")  # "pipesched: " or "pipesched COMMAND: "


@pytest.mark.parametrize("args", [
    ["simulate", "1f1b", "-p", "two", "-m", "2"],  # a bad option value (argparse)
    ["simulate", "1f1b", "-p", "2", "-m", "2", "--engine", "fast"],  # a bad choice (argparse)
    ["simulate", "/no/such.json"],  # a missing file
    ["simulate", "1f1b", "-p", "2", "-m", "2", "--costs", "/no/such.json"],
    ["simulate", "nope", "-p", "2", "-m", "2"],  # a bad schedule name
    ["frobnicate"],  # an unknown command
    [],  # no command
])
def test_an_error_is_one_line_with_the_prefix_once(capsys, args):
    code, _, err = cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert PREFIX.match(err) and len(PREFIX.findall(err)) == 1, err
    assert ": error: " in err


def test_an_executor_command_without_torch_says_so_with_the_prefix_once(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pipesched.executor.job", None)  # import raises ImportError
    code, _, err = cli(capsys, "run", "1f1b", "-p", "2", "-m", "2")
    assert code == 2 and "run needs torch" in err and len(PREFIX.findall(err)) == 1, err


def test_version_prints_the_installed_version_and_exits_0(capsys):
    from importlib.metadata import version

    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.split() == ["pipesched", version("pipesched")]
    done = subprocess.run([sys.executable, "-m", "pipesched", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["pipesched", version("pipesched")]


def test_version_falls_back_to_the_package_when_not_installed(monkeypatch):
    import importlib.metadata

    import pipesched
    from pipesched.cli import version

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version() == pipesched.__version__


def test_commands_write_temporary_files_where_the_suite_checks_them(suite_temporary_directory):
    # conftest's check: what a command leaves there (e.g. a pipesched-validate-* folder) fails its test
    import os
    import tempfile

    assert tempfile.gettempdir() == os.environ["TMPDIR"] == str(suite_temporary_directory)
    done = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(suite_temporary_directory)


def test_simulate_prints_the_critical_path_in_the_tables_unit(capsys):
    code, out, _ = cli(capsys, "simulate", "zb-h1", "-p", "2", "-m", "4", "--f", "1.2ms", "--b", "1.5ms", "--w",
                       "0.7ms", "--bandwidth", "1e9", "--activation-bytes", "1e5")
    (line,) = [line for line in out.splitlines() if line.startswith("critical path:")]
    spans = re.findall(r"\((?:rank \d+|\d+->\d+), ([^)]*)\)", line)
    assert code == 0 and len(spans) == 2, line
    assert all(re.fullmatch(r"\d+(\.\d+)?-\d+(\.\d+)? ms", span) for span in spans), line
    assert not re.search(r"\d\.\d{5,}|e-\d", line), line  # no raw seconds
    # --json keeps seconds, as every number there
    code, out, _ = cli(capsys, "simulate", "zb-h1", "-p", "2", "-m", "4", "--f", "1.2ms", "--json")
    assert json.loads(out)["critical_path"][0].endswith("(rank 0, 0-0.0012)")


@pytest.mark.parametrize("args", [
    ["list"],
    ["show", "zb-v", "-p", "2", "-m", "4"],
    ["simulate", "zb-h1", "-p", "2", "-m", "4", "--f", "1ms", "--activation-bytes", "1MB"],
    ["simulate", "1f1b", "-p", "2", "-m", "4", "--runs", "3"],
])
def test_microbatches_are_never_abbreviated_mb(capsys, args):
    # "mb" reads as megabytes: outputs say microbatches, or m=
    code, out, err = cli(capsys, *args)
    assert code == 0 and not re.search(r"\bmbs?\b", out + err, re.IGNORECASE), out


def test_bad_files_are_one_line_and_exit_2(capsys, tmp_path):
    (tmp_path / "bad.json").write_text('{"format": "pipesched.schedule/1"}')
    code, _, err = cli(capsys, "show", str(tmp_path / "bad.json"))
    assert code == 2 and "lacks 'name'" in err
    (tmp_path / "costs.json").write_text('{"stage": [1, 2]}')
    code, _, err = cli(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--costs", str(tmp_path / "costs.json"))
    assert code == 2 and "stage must be an object" in err


def test_the_console_script_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "gpipe", "-p", "2", "-m", "2", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["makespan"] == 9


def test_import_and_export_torch(capsys, tmp_path):
    pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
    out = tmp_path / "zbv.json"
    code, _, _ = cli(capsys, "import-torch", "ZBVZeroBubble", "-p", "2", "-m", "4", "-o", str(out))
    assert code == 0 and fileformat.load(out).name == "torch:ZBVZeroBubble"
    code, text, _ = cli(capsys, "simulate", "torch:Interleaved1F1B", "-p", "4", "-m", "8", "--json")
    assert json.loads(text)["makespan"] == 28.5
    csv_path = tmp_path / "zbh2.csv"
    code, _, _ = cli(capsys, "export-torch", "zb-h2", "-p", "2", "-m", "3", "-o", str(csv_path))
    assert code == 0 and csv_path.read_text().splitlines()[0].startswith("0F0,")
    code, text, _ = cli(capsys, "import-torch", str(csv_path))
    assert fileformat.loads(text).programs == build("zb-h2", 2, 3).programs
    code, _, err = cli(capsys, "export-torch", "dualpipe", "-p", "2", "-m", "4")
    assert code == 2 and "more than one rank" in err
    code, _, err = cli(capsys, "import-torch", "Nope", "-p", "2", "-m", "4")
    assert code == 2 and "unknown torch schedule" in err
