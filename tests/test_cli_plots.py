"""The figure and trace-export command lines: outputs, and one line + exit 2 on bad input."""
import csv
import io
import json

import pytest

from pipesched.cli import main
from pipesched.commands import sweep as sweep_cmd

COSTS = ["--latency", "0.05", "--bandwidth", "1e7", "--activation-bytes", "1e6", "--activation-memory", "1e9",
         "--param-bytes", "2e9"]


def fails(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_simulate_writes_png_svg_and_perfetto(tmp_path, capsys):
    png, svg, pf = tmp_path / "t.png", tmp_path / "t.svg", tmp_path / "t.perfetto.json"
    assert main(["simulate", "dualpipe", "-p", "4", "-m", "8", *COSTS, "--plot", str(png), "--perfetto", str(pf)]) == 0
    assert main(["simulate", "zb-v", "-p", "2", "-m", "4", "--plot", str(svg)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and "<svg" in svg.read_text()[:1000]
    assert {e["ph"] for e in json.loads(pf.read_text())["traceEvents"]} >= {"M", "X", "s", "f", "C"}
    assert "makespan" in capsys.readouterr().out


def test_simulate_refuses_an_unknown_figure_extension_before_simulating(tmp_path, capsys):
    fails(capsys, ["simulate", "1f1b", "-p", "4", "-m", "8", "--plot", str(tmp_path / "t.jpeg")], ".png, .svg")
    assert not list(tmp_path.iterdir())


def test_plot_draws_a_trace_and_a_trace_against_another(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", *COSTS, "--trace", str(a)]) == 0
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", *COSTS, "--f", "1.2", "--trace", str(b)]) == 0
    assert main(["plot", str(a), "-o", str(tmp_path / "one.png")]) == 0
    assert main(["plot", str(b), "--vs", str(a), "-o", str(tmp_path / "two.svg"), "--no-memory"]) == 0
    assert main(["plot", str(a), "--perfetto", str(tmp_path / "a.pf.json")]) == 0
    assert (tmp_path / "one.png").stat().st_size > 10_000 and (tmp_path / "two.svg").exists()
    assert json.loads((tmp_path / "a.pf.json").read_text())["otherData"]["schedule"] == "zb-h1"


def test_plot_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    good = tmp_path / "good.json"
    main(["simulate", "1f1b", "-p", "4", "-m", "8", "--trace", str(good)])
    other = tmp_path / "other.json"
    main(["simulate", "1f1b", "-p", "2", "-m", "8", "--trace", str(other)])
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"format": "pipesched.trace/1", "spans": ')
    (tmp_path / "wrong.json").write_text('{"format": "something else"}')
    out = str(tmp_path / "x.png")
    fails(capsys, ["plot", str(tmp_path / "missing.json"), "-o", out], "cannot read trace")
    fails(capsys, ["plot", str(tmp_path / "bad.json"), "-o", out], "not valid JSON")
    fails(capsys, ["plot", str(tmp_path / "wrong.json"), "-o", out], "trace format")
    fails(capsys, ["plot", str(good), "-o", str(tmp_path / "x.gif")], "must end in")
    fails(capsys, ["plot", str(good)], "needs -o")
    fails(capsys, ["plot", str(good), "--vs", str(other), "-o", out], "differ")
    fails(capsys, ["plot", str(good), "-o", str(tmp_path / "no" / "dir.png")], "cannot write")


def test_sweep_prints_writes_csv_and_chart(tmp_path, capsys):
    chart, table = tmp_path / "s.png", tmp_path / "s.csv"
    argv = ["sweep", "-p", "4", "--microbatches", "8,4", "--schedules", "1f1b,zb-v,dualpipe", *COSTS,
            "--plot", str(chart), "--csv", str(table)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("zb-v") == 2 and chart.read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(table.open()))
    assert [(r["schedule"], r["microbatches"]) for r in rows] == \
        [(s, m) for s in ("1f1b", "zb-v", "dualpipe") for m in ("4", "8")]
    assert all(0 < float(r["bubble_ratio"]) < 1 and float(r["peak_memory"]) > 2e9 for r in rows)


def test_sweep_skips_a_schedule_that_cannot_be_built_and_says_why(capsys):
    assert main(["sweep", "-p", "3", "--microbatches", "4", "--schedules", "1f1b,dualpipe"]) == 0
    assert "dualpipe" in capsys.readouterr().out.split("skipped")[0].splitlines()[-1]
    fails(capsys, ["sweep", "-p", "3", "--microbatches", "4", "--schedules", "dualpipe"], "no schedule")


@pytest.mark.parametrize("args,message", [
    (["--microbatches", "4,x"], "--microbatches"),
    (["--microbatches", "0,4"], "--microbatches"),
    (["--microbatches", "4", "--schedules", "1f1b,nope"], "unknown schedule 'nope'"),
    (["--microbatches", "4", "--plot", "s.tiff"], "must end in"),
    (["--microbatches", "4,8", "--pareto-m", "16"], "--pareto-m"),
])
def test_sweep_bad_input_is_one_line_and_exit_2(capsys, args, message):
    fails(capsys, ["sweep", "-p", "4", *args], message)


class Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bar_redraws_on_a_terminal_and_stays_quiet_elsewhere_when_fast(monkeypatch):
    tty, pipe = Stream(True), Stream(False)
    for stream in (tty, pipe):
        bar = sweep_cmd.Progress(4, stream)
        for i in range(5):
            bar(i, "x")
        bar.close()
    assert tty.getvalue().count("\r") == 5 and "4/4" in tty.getvalue() and tty.getvalue().endswith("\n")
    assert pipe.getvalue() == ""
    monkeypatch.setattr(sweep_cmd, "PROGRESS_AFTER_S", 0.0)  # as if the sweep ran long
    slow = Stream(False)
    bar = sweep_cmd.Progress(4, slow)
    for i in range(5):
        bar(i, "x")
    assert "\r" not in slow.getvalue() and slow.getvalue().count("\n") == 4


def test_progress_bar_follows_stderr_as_it_is_when_the_sweep_starts(monkeypatch):
    # the default stream is looked up per sweep, so a terminal gets the bar
    terminal = Stream(True)
    monkeypatch.setattr("sys.stderr", terminal)
    bar = sweep_cmd.Progress(2)
    bar(1, "x")
    bar.close()
    assert bar.stream is terminal and terminal.getvalue().startswith("\rsweep [")


def test_plot_vs_with_perfetto_writes_both_runs(tmp_path):
    a, b, pf = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "both.json"
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", *COSTS, "--trace", str(a)]) == 0
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", *COSTS, "--f", "1.2", "--trace", str(b)]) == 0
    assert main(["plot", str(a), "--vs", str(b), "--perfetto", str(pf)]) == 0
    events = json.loads(pf.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {f"{run} (simulated) rank {r}" for run in ("a", "b") for r in range(4)}
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 2 * len([e for e in spans if e["pid"] < 4])


def test_figure_flags_shape_the_figure_and_need_one(tmp_path, capsys):
    out = tmp_path / "w.png"
    assert main(["simulate", "1f1b", "-p", "8", "-m", "8", "--plot", str(out), "--window", "2,6",
                 "--figsize", "10,5"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    fails(capsys, ["simulate", "1f1b", "-p", "2", "-m", "2", "--window", "1,2"], "add --plot")
    fails(capsys, ["simulate", "1f1b", "-p", "2", "-m", "2", "--plot", str(out), "--figsize", "10"], "W,H")
    fails(capsys, ["simulate", "1f1b", "-p", "2", "-m", "2", "--plot", str(out), "--window", "3,1"], "START < END")
