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


# --- outputs onto devices, FIFOs and the process's own files ------------------------------

def _is_char_device(path) -> bool:
    import stat
    return stat.S_ISCHR(os.stat(path).st_mode)


@pytest.fixture
def devices_kept():
    """/dev/null and /dev/full must still be devices after the test (an atomic write used
    to rename a regular file over them); put back if they were replaced."""
    yield
    replaced = []
    for path, minor in (("/dev/null", 3), ("/dev/full", 7)):
        if os.path.exists(path) and not _is_char_device(path):
            os.unlink(path)
            subprocess.run(["mknod", "-m", "666", path, "c", "1", str(minor)], check=False)
            replaced.append(path)
    if replaced:
        pytest.fail(f"{', '.join(replaced)} replaced by a regular file")


def _read_fifo(path: Path) -> tuple:
    import threading
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(path.read_bytes()), daemon=True)
    reader.start()
    return reader, got


FIFO_OUTPUTS = {
    "plan -o": (["plan", "-p", "4", "-m", "8", "--f", "1ms", "--b", "1ms", "--w", "1ms", "-o", "OUT"],
                b'"format": "pipesched.schedule/1"'),
    "simulate --trace": (["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", "OUT"], b'"pipesched.trace/1"'),
    "simulate --perfetto": (["simulate", "1f1b", "-p", "2", "-m", "4", "--perfetto", "OUT"], b'"traceEvents"'),
}


@pytest.mark.parametrize("case", sorted(FIFO_OUTPUTS))
def test_an_output_onto_a_fifo_is_written_into_it(capsys, tmp_path, case):
    argv, content = FIFO_OUTPUTS[case]
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    reader, got = _read_fifo(fifo)
    assert main([str(fifo) if a == "OUT" else a for a in argv]) == 0, capsys.readouterr().err
    reader.join(10)
    assert got and content in got[0]
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["out.json"]  # not renamed over, no temporary file


@pytest.mark.skipif(not hasattr(os, "mknod") or os.geteuid() != 0, reason="making a device node needs root")
def test_an_output_onto_a_character_device_keeps_the_device(capsys, tmp_path, devices_kept):
    null = tmp_path / "null"
    os.mknod(null, 0o020666, os.makedev(1, 3))  # a null device of our own
    for argv in (["plan", "-p", "4", "-m", "8", "--f", "1ms", "-o", null, "--plot", null.with_suffix(".png")],
                 ["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", null, "--perfetto", null]):
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
        assert _is_char_device(null)
    # and the real one, as the command line is usually given it
    assert main(["plan", "-p", "4", "-m", "8", "--f", "1ms", "--b", "1ms", "--w", "1ms", "-o", "/dev/null"]) == 0
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", "/dev/null", "--perfetto", "/dev/null"]) == 0
    assert _is_char_device("/dev/null")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_error_on_a_device_is_one_line(capsys, devices_kept):
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", "/dev/full"],
            "cannot write '/dev/full': No space left on device")
    assert _is_char_device("/dev/full")


def test_a_folder_socket_or_empty_name_is_refused_as_an_output(capsys, tmp_path):
    import socket
    refused(capsys, ["plan", "-p", "4", "-m", "8", "-o", tmp_path], "it is a directory")
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", sock_path], "it is a socket")
    refused(capsys, ["plan", "-p", "4", "-m", "8", "-o", ""], "-o '' names no file")
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", ""], "--trace '' names no file")
    refused(capsys, ["validate", "1f1b", "-p", "2", "-m", "2", "--out", ""], "--out '' names no folder")


def test_dev_stdout_redirected_to_a_file_gets_the_whole_output(tmp_path):
    # opening /dev/stdout again truncated the file and wrote over what the command printed
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "1f1b", "-p", "2", "-m", "4", "--trace",
                               "/dev/stdout"], stdout=fh, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.count('"format": "pipesched.trace/1"') == 1 and "critical path" in text, text[:300]


@torch_needed
@pytest.mark.distributed
def test_run_writes_its_trace_into_a_fifo(tmp_path):
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    reader, got = _read_fifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "pipesched", "run", "1f1b", "-p", "2", "-m", "2", "--hidden", "16",
                           "--steps", "1", "--warmup", "0", "--min-time", "0", "--no-check", "--trace", str(fifo)],
                          capture_output=True, text=True, timeout=300)
    reader.join(10)
    assert proc.returncode == 0, proc.stderr
    assert got and b'"pipesched.trace/1"' in got[0] and fifo.is_fifo()


# --- the user's --model function runs under the same rules -------------------------------------

HOSTILE_MODELS = '''
import hashlib, multiprocessing, sys, threading, time
import torch
from torch import nn
from pipesched.executor.models import PipelineModel, mse_loss

def _model(num_stages, microbatches, stage=nn.Linear):
    torch.manual_seed(0)
    xs = [torch.randn(2, 4) for _ in range(microbatches)]
    return PipelineModel([stage(4, 4) for _ in range(num_stages)], mse_loss, xs, [x.clone() for x in xs])

def interrupts(n, m):
    raise KeyboardInterrupt

def base_exception(n, m):
    raise BaseException("boom")

def exits(n, m):
    sys.exit(3)

def no_stages(n, m):
    return PipelineModel(None, mse_loss, [], [])

def int_inputs(n, m):
    model = _model(n, m)
    model.inputs = 5
    return model

def loss_is_a_number(n, m):
    model = _model(n, m)
    model.loss_fn = 3
    return model

class NoState(nn.Linear):
    def __setstate__(self, state):
        raise ValueError("no state here")

def cannot_be_unpickled(n, m):
    return _model(n, m, NoState)

def in_a_rank():
    return multiprocessing.current_process().name.startswith("pipesched-rank")

class NoStateInRanks(nn.Linear):
    def __setstate__(self, state):
        if in_a_rank():
            raise ValueError("no state in a rank")
        super().__setstate__(state)

def cannot_be_unpickled_in_ranks(n, m):
    return _model(n, m, NoStateInRanks)

class HangsInRanks(nn.Linear):
    def forward(self, x):
        if in_a_rank():
            time.sleep(1000)
        return super().forward(x)

def hangs_in_ranks(n, m):
    return _model(n, m, HangsInRanks)

class Hangs(nn.Linear):
    def forward(self, x):
        open("started", "w").close()
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2 ** 31 - 1)  # minutes in C: no signal handler runs meanwhile

def hangs(n, m):
    return _model(n, m, Hangs)

def leaves_a_thread(n, m):
    threading.Thread(target=time.sleep, args=(1000,)).start()
    return PipelineModel(None, mse_loss, [], [])
'''


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """A module of misbehaving --model functions in the working directory."""
    (tmp_path / "hostile_models.py").write_text(HOSTILE_MODELS)
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(9)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("hostile_models", "exits_at_import"):
        sys.modules.pop(name, None)


@torch_needed
@pytest.mark.parametrize("spec,message", [
    ("exits_at_import:f", "--model exits_at_import:f: importing exits_at_import called sys.exit(9)"),
    ("hostile_models:interrupts", "interrupts(num_stages, microbatches) raised KeyboardInterrupt"),
    ("hostile_models:base_exception", "base_exception(num_stages, microbatches) failed: BaseException: boom"),
    ("hostile_models:exits", "exits(num_stages, microbatches) called sys.exit(3)"),
    ("hostile_models:no_stages", "returned a PipelineModel whose stages is NoneType, not a non-empty list"),
    ("hostile_models:int_inputs", "returned a PipelineModel whose inputs is int"),
    ("hostile_models:loss_is_a_number", "returned a PipelineModel whose loss_fn is int, not a function"),
    ("hostile_models:cannot_be_unpickled", "cannot be unpickled, as the ranks must: ValueError: no state here"),
])
def test_anything_the_user_s_function_does_is_one_line_naming_it(capsys, hostile, monkeypatch, spec, message):
    from pipesched.executor import job, launch

    def boom(*args, **kwargs):
        raise AssertionError("launched processes for bad input")
    monkeypatch.setattr(job, "launch_local", boom)
    monkeypatch.setattr(launch, "launch_local", boom)
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--model", spec], f"--model {spec}")
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--model", spec], message)


def _cli(*args, cwd, timeout=120, **kwargs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pipesched", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def _one_line(proc, code: int, message: str) -> None:
    assert proc.returncode == code and proc.stderr.count("\n") == 1 and message in proc.stderr, \
        (proc.returncode, proc.stderr)


@torch_needed
def test_exit_at_import_and_threads_left_running_do_not_decide_the_exit(hostile):
    # sys.exit(9) at import exited 9 with nothing said; a thread the function left kept the process alive
    _one_line(_cli("run", "1f1b", "-p", 2, "-m", 2, "--model", "exits_at_import:f", cwd=hostile), 2,
              "importing exits_at_import called sys.exit(9)")
    t0 = time.monotonic()
    _one_line(_cli("run", "1f1b", "-p", 2, "-m", 2, "--model", "hostile_models:leaves_a_thread", cwd=hostile,
                   timeout=60), 2, "whose stages is NoneType")
    assert time.monotonic() - t0 < 30


@torch_needed
def test_a_hang_in_the_user_s_model_check_is_cut_by_timeout(hostile):
    t0 = time.monotonic()
    _one_line(_cli("run", "1f1b", "-p", 2, "-m", 2, "--model", "hostile_models:hangs", "--timeout", 2,
                   cwd=hostile, timeout=60), 2, "--model hostile_models:hangs: the model check did not finish "
                                                 "within --timeout 2 s")
    assert time.monotonic() - t0 < 30


@torch_needed
def test_sigterm_stops_a_long_model_check_at_once(hostile):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hostile), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "pipesched", "run", "1f1b", "-p", "2", "-m", "2", "--model",
                             "hostile_models:hangs"], cwd=hostile, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (hostile / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (hostile / "started").exists()
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 5
        assert proc.stderr.read() == "pipesched: stopped by SIGTERM\n"
    finally:
        proc.kill()
        proc.wait()


@torch_needed
@pytest.mark.distributed
@pytest.mark.parametrize("spec,message", [
    ("hostile_models:cannot_be_unpickled_in_ranks",
     "the model hostile_models:cannot_be_unpickled_in_ranks cannot be unpickled in the rank: ValueError: no state"),
    ("hostile_models:hangs_in_ranks", "the model check did not finish within --timeout 3 s"),
])
def test_the_user_s_model_failing_in_the_ranks_is_one_line(hostile, spec, message):
    # two tracebacks and "rank 0 exited with status 1 without reporting"; a hang never timed out
    proc = _cli("run", "1f1b", "-p", 2, "-m", 2, "--model", spec, "--timeout", 3, "--steps", 1, "--warmup", 0,
                "--min-time", 0, cwd=hostile, timeout=120)
    _one_line(proc, 2, message)
    assert "Traceback" not in proc.stderr


@torch_needed
def test_layers_per_stage_with_a_user_model_is_refused(capsys, hostile):
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--model", "hostile_models:exits", "--layers-per-stage",
                     "3"], "--layers-per-stage sizes the example and hf-* models")


@torch_needed
@pytest.mark.parametrize("layers,message", [
    ("1000000,1", "asks for 1,000,001 blocks in all; a model has at most 10,000"),
    ("99999999999999999999", "a model has at most 10,000"),
])
def test_block_counts_are_bounded_before_anything_is_built(capsys, layers, message):
    # 1000000,1 took 3 GB and a minute counting parameters on the meta device
    t0 = time.monotonic()
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", "--layers-per-stage", layers], message)
    assert time.monotonic() - t0 < 5


def _have_transformers() -> bool:
    import importlib.util
    return importlib.util.find_spec("transformers") is not None


@torch_needed
@pytest.mark.skipif(not _have_transformers(), reason="needs transformers")
@pytest.mark.parametrize("args", [
    ["--model", "hf-llama", "--vocab", "1000000000"],
    ["--model", "hf-llama", "--hidden", "1000000"],
    ["--model", "hf-gpt2", "--seq", "100000"],
])
def test_hf_presets_too_large_for_the_host_are_refused_before_building(capsys, args):
    # an allocator error, or 2.6 GB of attention in the launcher that ignored SIGTERM
    t0 = time.monotonic()
    refused(capsys, ["run", "1f1b", "-p", "2", "-m", "2", *args], "GiB are available")
    assert time.monotonic() - t0 < 10


@torch_needed
def test_validate_makes_its_out_folder_only_when_it_has_results(tmp_path, monkeypatch):
    # a run killed mid-way (here: failing) left an empty --out behind
    from pipesched.executor import validation

    def stopped(*args, **kwargs):
        assert not (tmp_path / "v").exists()  # the run is under way: nothing to write yet
        raise KeyboardInterrupt
    monkeypatch.setattr(validation, "validate_schedule", stopped)
    assert main(["validate", "1f1b", "-p", "2", "-m", "2", "--hidden", "16", "--out", str(tmp_path / "v")]) == 130
    assert not (tmp_path / "v").exists()
