"""Faults and hostile inputs: the launcher owns its ranks, readers are bounded,
limits are checked before work, outputs are written atomically and never over an input,
options that do nothing are refused, names are printed safely."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipesched.cli import main
from pipesched.schedules import fileformat
from pipesched.schedules.outputs import OutputError, atomic_path, write_text
from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import uniform
from pipesched.schedules.validate import validate
from pipesched.simulator.trace import Trace, TraceError

ROOT = Path(__file__).resolve().parents[1]


def refused(capsys, argv, message):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and "internal error" not in err, err
    return out, err


# --- outputs ---------------------------------------------------------------------------

def test_a_failed_write_leaves_the_previous_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("previous")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk full")
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["t.json"]
    write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["t.json"]


def test_a_write_into_a_missing_folder_is_an_output_error(tmp_path):
    with pytest.raises(OutputError, match="cannot write"):
        write_text(tmp_path / "no" / "t.json", "x")


def test_a_write_stopped_by_the_file_size_limit_keeps_the_old_file(tmp_path):
    # the file size limit in a child process: the trace is larger than it, the write fails
    old = tmp_path / "t.json"
    old.write_text("previous\n")
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
        from pipesched.cli import main
        sys.exit(main(["simulate", "1f1b", "-p", "4", "-m", "8", "--trace", {str(old)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot write" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert old.read_text() == "previous\n" and os.listdir(tmp_path) == ["t.json"]


def test_written_files_keep_the_permissions_a_plain_open_would_give(tmp_path):
    write_text(tmp_path / "new.json", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.fixture
def files(tmp_path):
    sched = tmp_path / "mine.json"
    fileformat.save(build("1f1b", 2, 4), sched)
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"format": "pipesched.costs/1", "stage": {"forward": 1}}))
    trace = tmp_path / "t.json"
    graph = validate(build("1f1b", 2, 4))
    simulate(graph, uniform()).save(trace)
    return sched, costs, trace


def test_an_output_that_is_also_an_input_is_refused_before_anything_is_written(capsys, files):
    sched, costs, trace = files
    before = {p: p.read_bytes() for p in files}
    refused(capsys, ["simulate", sched, "--trace", sched], "is also the input SCHEDULE")
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", costs, "--trace", costs],
            "is also the input --costs")
    refused(capsys, ["plot", trace, "--perfetto", trace], "is also the input TRACE")
    refused(capsys, ["simulate", sched, "--trace", trace, "--perfetto", trace], "name the same file")
    refused(capsys, ["sweep", "-p", "2", "-m", "4", "--costs", costs, "--csv", costs], "is also the input --costs")
    assert {p: p.read_bytes() for p in files} == before


def test_every_written_file_is_announced(capsys, files, tmp_path):
    sched, _, trace = files
    out = tmp_path / "out"
    out.mkdir()
    for argv, path in ((["simulate", sched, "--trace", out / "a.json"], out / "a.json"),
                       (["simulate", sched, "--perfetto", out / "b.json"], out / "b.json"),
                       (["plot", trace, "--perfetto", out / "c.json"], out / "c.json"),
                       (["export-torch", sched, "-o", out / "d.csv"], out / "d.csv"),
                       (["sweep", "-p", "2", "-m", "4", "--schedules", "1f1b", "--csv", out / "e.csv"], out / "e.csv")):
        assert main([str(a) for a in argv]) == 0
        stdout = capsys.readouterr().out
        assert f"wrote {path}" in stdout and path.exists(), stdout
    assert main(["simulate", str(sched), "--json", "--trace", str(out / "f.json")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["makespan"] > 0 and f"wrote {out / 'f.json'}" in captured.err


# --- bounded readers --------------------------------------------------------------------

LONG = "9" * 5000
HOSTILE = {
    "stage.csv": "99999999999F0\n",
    "mb.csv": "0F0,0W99999999999\n",
    "long.csv": f"0F{LONG}\n",
    "sparse_stage.csv": "0F0,0B0\n7F0,7B0\n",
    "cell.csv": "0F0," + "x" * 200_000 + "\n",
    "ranks.json": json.dumps({**fileformat.to_dict(build("1f1b", 2, 2)), "ranks": 10 ** 12}),
    "mbs.json": json.dumps({**fileformat.to_dict(build("1f1b", 2, 2)), "microbatches": 10 ** 12,
                            "microbatch_paths": [0, 0]}),
    "long.json": '{"format": "pipesched.schedule/1", "ranks": ' + LONG + "}",
    "trace_stage.json": None,  # filled below: a trace whose stage index is absurd
    "trace_ranks.json": json.dumps({"format": "pipesched.trace/1", "schedule": "x", "ranks": 2 ** 31 - 1,
                                    "microbatches": 2 ** 31 - 1, "columns": ["rank", "lane", "op", "mb", "stage",
                                    "start", "end", "peer", "overlapped"], "spans": [], "memory": []}),
    "trace_memory.json": None,
    "costs_long.json": '{"format": "pipesched.costs/1", "stage": {"forward": ' + LONG + "}}",
    "costs_long.toml": 'format = "pipesched.costs/1"\n[stage]\nforward = ' + LONG + "\n",
}


def _hostile_files(folder: Path) -> dict[str, Path]:
    trace = simulate(validate(build("1f1b", 2, 2)), uniform()).to_dict()
    trace["spans"][0][4] = 99_999_999
    HOSTILE["trace_stage.json"] = json.dumps(trace)
    trace = simulate(validate(build("1f1b", 2, 2)), uniform()).to_dict()
    trace["memory"][0][0][1] = -5.0
    HOSTILE["trace_memory.json"] = json.dumps(trace)
    paths = {}
    for name, text in HOSTILE.items():
        paths[name] = folder / name
        paths[name].write_text(text)
    return paths


def _argv(name: str, path: Path) -> list[str]:
    if name.startswith("trace"):
        return ["plot", str(path), "--perfetto", str(path.with_suffix(".out.json"))]
    if name.startswith("costs"):
        return ["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", str(path)]
    return ["show", str(path)]


def test_hostile_files_are_refused_in_one_line_within_a_4_gib_address_space(tmp_path):
    """Every reader checks sizes before it allocates: under RLIMIT_AS = 4 GiB a memory
    bomb would end in MemoryError ("internal error", exit 1); each must be exit 2, one line."""
    paths = _hostile_files(tmp_path)
    script = textwrap.dedent("""
        import contextlib, io, json, resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from pipesched.cli import main
        results = {}
        for name, argv in json.loads(sys.argv[1]).items():
            err = io.StringIO()
            t0 = time.monotonic()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            results[name] = [code, err.getvalue(), time.monotonic() - t0]
        print(json.dumps(results))
    """)
    argv = {name: _argv(name, path) for name, path in paths.items()}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(argv)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name, (code, err, seconds) in json.loads(proc.stdout).items():
        assert code == 2 and err.count("\n") == 1 and "internal error" not in err, (name, err)
    # the messages say what is wrong
    results = json.loads(proc.stdout)
    assert "10**9" in results["stage.csv"][1] and "10**9" in results["long.csv"][1]
    assert "never stage 1" in results["sparse_stage.csv"][1]
    assert "stage 99999999" in results["trace_stage.json"][1]
    assert "never negative" in results["trace_memory.json"][1]


def test_negative_memory_in_a_trace_is_refused():
    trace = simulate(validate(build("1f1b", 2, 2)), uniform()).to_dict()
    trace["memory"][1][-1][1] = -1.0
    with pytest.raises(TraceError, match="memory is never negative"):
        Trace.from_dict(trace)


def test_calibrated_model_stages_of_another_length_are_refused(capsys, tmp_path):
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"format": "pipesched.costs/1", "model_stages": [{"forward": 1}] * 3}))
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", costs],
            "model_stages for 3 model stages but the schedule has 2")
    refused(capsys, ["simulate", "zb-h2", "-p", "2", "-m", "4", "--costs", costs], "model_stages for 3")


# --- limits before work -----------------------------------------------------------------

def test_per_rank_stage_lookup_is_one_pass_and_show_uses_it(capsys, monkeypatch):
    sched = build("interleaved-1f1b", 4, 4, 3)
    assert sched.stages_by_rank() == [sched.stages_of_rank(r) for r in range(4)]
    from pipesched.schedules.ir import Schedule

    def per_rank_scan(self, rank):
        raise AssertionError("show must not scan the stages once per rank")
    monkeypatch.setattr(Schedule, "stages_of_rank", per_rank_scan)
    assert main(["show", "1f1b", "-p", "300", "-m", "1"]) == 0
    assert "rank 299 [stages 299 (model 299)]" in capsys.readouterr().out


def test_names_with_control_characters_are_escaped_when_printed(capsys, tmp_path):
    sched = build("1f1b", 2, 2)
    sched.name = "evil\x1b[2J\x00\u202e\r"
    path = tmp_path / "evil.json"
    fileformat.save(sched, path)
    for argv in (["show", path], ["simulate", path]):
        assert main([str(a) for a in argv]) == 0
        out = capsys.readouterr().out
        assert "evil\\x1b[2J\\x00\\u202e\\x0d" in out and not any(c in out for c in "\x1b\x00\u202e\r"), out


def test_printable_keeps_ordinary_text_of_any_script():
    from pipesched.terminal import printable
    assert printable("zb-v 零バブル é") == "zb-v 零バブル é"
    assert printable("a\tb\nc\x7f") == "a\\x09b\\x0ac\\x7f"


# --- executor: limits and the launcher ---------------------------------------------------

torch_needed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="needs torch")


@torch_needed
def test_ranks_that_cannot_be_launched_here_are_refused_before_anything_is_built(capsys, tmp_path):
    refused(capsys, ["run", "1f1b", "-p", "100000", "-m", "1"], "cannot be launched")
    refused(capsys, ["calibrate", "1f1b", "-p", "100000", "-m", "1", "-o", tmp_path / "c.json"],
            "cannot be launched")
    # an output that cannot be written is refused before the run, not after it
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--trace", "/missing/dir/t.json"], "there is no folder")
    (tmp_path / "mine.json").write_text("{}")
    refused(capsys, ["validate", "1f1b", "-p", "2", "-m", "2", "--out", tmp_path / "mine.json" / "x"],
            "--out")


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@torch_needed
@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_launcher_stopped_mid_run_takes_every_rank_with_it(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    launcher = subprocess.Popen([sys.executable, "-m", "pipesched", "run", "1f1b", "-p", "2", "-m", "4",
                                 "--steps", "100000", "--no-check"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        ranks: list[int] = []
        # mid-run: both ranks started and past importing torch (a few CPU seconds each)
        while time.monotonic() < deadline:
            ranks = _children(launcher.pid)
            ranks = [r for r in ranks if "spawn_main" in _cmdline(r)]  # not the resource tracker
            if len(ranks) == 2 and all(_cpu_seconds(r) > 4.0 for r in ranks):
                break
            assert launcher.poll() is None, launcher.communicate()
            time.sleep(0.2)
        assert len(ranks) == 2, "the ranks never started"
        os.kill(launcher.pid, sig)
        stopped = time.monotonic()
        _, err = launcher.communicate(timeout=30)
        while any(_alive(r) for r in ranks) and time.monotonic() < stopped + 15:
            time.sleep(0.1)
        assert not any(_alive(r) for r in ranks), "a rank outlived its launcher by 15 s"
        if sig == signal.SIGTERM:
            assert launcher.returncode == 128 + sig, err
            # progress lines first, then one line for the stop
            assert err.strip().splitlines()[-1] == "pipesched: stopped by SIGTERM; every rank was stopped", err
        else:
            assert launcher.returncode == -sig
        assert os.listdir(tmp) == []  # nothing left in the temporary directory
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@torch_needed
@pytest.mark.distributed
def test_a_script_without_a_main_guard_gets_one_clear_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        from pipesched.executor.job import RunOptions, launch
        from pipesched.executor.models import ExampleModel
        from pipesched.schedules.registry import build
        launch(build("1f1b", 2, 2), ExampleModel("mlp", 16, 1, 2), RunOptions(check=False))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert 'if __name__ == "__main__":' in last and "bootstrapping" not in proc.stderr, proc.stderr


def test_long_stochastic_runs_report_progress_on_stderr(capsys, monkeypatch):
    from pipesched import terminal
    monkeypatch.setattr(terminal, "PROGRESS_AFTER_S", 0.0)  # as if each run took long
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--runs", "20", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["stochastic"]["runs"] == 20
    assert "simulate --runs: 20/20 done" in captured.err and captured.err.count("\n") == 10


@pytest.mark.parametrize("argv,message", [
    (["sweep", "-p", "2", "-m", "4", "--schedules", "1f1b,zb-v", "-v", "3"], "-v applies to schedules"),
    (["plot", "TRACE", "--perfetto", "OUT", "--title", "x"], "--title only shapes a figure"),
    (["plot", "TRACE", "--perfetto", "OUT", "--no-memory"], "--no-memory only shapes a figure"),
])
def test_options_that_would_do_nothing_are_refused(capsys, files, tmp_path, argv, message):
    _, _, trace = files
    argv = [str(trace) if a == "TRACE" else str(tmp_path / "o.json") if a == "OUT" else a for a in argv]
    refused(capsys, argv, message)
    assert not (tmp_path / "o.json").exists()


@torch_needed
def test_seq_without_the_transformer_is_refused(capsys):
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--seq", "64"], "--seq is the sequence length of the transformer")
