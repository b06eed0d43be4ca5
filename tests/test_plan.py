"""`pipesched plan`, and one schedule order for every command given the same costs."""
import csv
import io
import json
import re

import pytest

import pipesched as ps
from pipesched.cli import main
from pipesched.schedules import fileformat
from pipesched.schedules.activations import peak_activations

USER = ["--f", "12ms", "--b", "14ms", "--w", "10ms", "--activation-bytes", "128MiB", "--bandwidth", "50GB/s"]
MEMORY = ["--activation-memory", "2GiB", "--param-bytes", "4GiB"]


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def simulated(capsys, *args):
    code, out, err = cli(capsys, "simulate", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_json_names_the_best_fitting_schedule_and_every_candidate(capsys, tmp_path):
    out_file = tmp_path / "best.json"
    code, out, err = cli(capsys, "plan", "-p", 4, "-m", "8,16", *USER, *MEMORY, "--memory-limit", "12GiB",
                         "-o", out_file, "--json")
    assert code == 0, err
    doc = json.loads(out)
    best, cands = doc["best"], doc["candidates"]
    assert {"schedule", "microbatches", "v", "makespan", "peak_memory"} <= set(best)
    fitting = [c for c in cands if c.get("fits")]
    over = [c for c in cands if c.get("fits") is False]
    assert over and all(c["peak_memory"] > 12 * 2 ** 30 for c in over)       # zb-h2 and gpipe do not fit
    assert all(c["peak_memory"] <= 12 * 2 ** 30 for c in fitting)
    assert best["throughput"] == max(c["throughput"] for c in fitting)
    # every built-in that fits is at most as fast as zb-auto at the same m
    for m in (8, 16):
        auto = min(c["makespan"] for c in fitting if c["schedule"] == "zb-auto" and c["microbatches"] == m)
        assert all(auto <= c["makespan"] * (1 + 1e-9) for c in fitting if c["microbatches"] == m)
    # the file simulates to exactly what plan reported
    again = simulated(capsys, out_file, *USER, *MEMORY)
    assert again["makespan"] == pytest.approx(best["makespan"], rel=1e-9)
    assert max(r["peak_memory_bytes"] for r in again["per_rank"]) == pytest.approx(best["peak_memory"], rel=1e-9)
    assert not list(tmp_path.glob(".pipesched-*"))  # the temporary file was renamed


def test_plan_prints_a_ranked_table_the_pareto_front_and_how_to_run_it(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = cli(capsys, "plan", "-p", 4, "--global-batch", 64, "--microbatch-size", 4, "-v", "2",
                         "--max-activations", 3, "--f", 1, "--b", 2, "--w", 1, "-o", out_file)
    assert code == 0, err
    assert "samples/s" in out and "Pareto front" in out and f"wrote {out_file}" in out
    assert f"pipesched simulate {out_file} --f 1 --b 2 --w 1" in out and "pipesched validate" in out
    schedule = fileformat.load(out_file)
    assert schedule.microbatches == 16 and peak_activations(schedule) <= 3
    assert "zb-h2" not in out.split("Pareto")[0]  # holds 2p-1 = 7: dropped


def test_plan_says_when_nothing_fits(capsys):
    # 4 GiB of parameters and, even recomputing, one chunk's activations (1 GiB at v=2) on top
    code, _, err = cli(capsys, "plan", "-p", 4, "-m", 8, *MEMORY, "--memory-limit", "4.5GiB")
    # progress lines may come first on a slow machine; the error is one line, the last
    errors = [x for x in err.splitlines() if "error" in x]
    assert code == 2 and len(errors) == 1 and "no schedule fits" in err.splitlines()[-1]


@pytest.mark.parametrize("args,message", [
    (["-m", "8..4"], "-m A..B needs 1 <= A <= B"),
    (["-v", "x"], "-v needs comma-separated integers"),
    (["--global-batch", "10", "--microbatch-size", "4"], "not a positive multiple"),
    (["--global-batch", "16"], "--global-batch needs --microbatch-size"),
    (["--schedules", "nope"], "unknown schedule 'nope'"),
    (["--processes", "0"], "--processes must be an integer >= 1"),
])
def test_plan_bad_input_is_one_line(capsys, args, message):
    code, _, err = cli(capsys, "plan", "-p", 4, *args)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_plan_m_range_doubles():
    from pipesched.commands.plan import parse_range
    assert parse_range("8..64", 8) == [8, 16, 32, 64] and parse_range(None, 4) == [8]


@pytest.mark.parametrize("name", ["zb-h2", "zb-v", "zb-auto"])
def test_a_file_written_by_show_simulates_to_what_simulate_printed(capsys, tmp_path, name):
    path = tmp_path / "s.json"
    code, out, _ = cli(capsys, "show", name, "-p", 4, "-m", 8, *USER, "--json")
    assert code == 0
    path.write_text(out)
    code, by_name, _ = cli(capsys, "simulate", name, "-p", 4, "-m", 8, *USER)
    code2, by_file, _ = cli(capsys, "simulate", path, *USER)
    assert code == code2 == 0
    assert by_file.replace(fileformat.load(path).name, name) == by_name


def test_export_torch_takes_the_costs_and_writes_the_simulated_order(capsys, tmp_path):
    path = tmp_path / "s.json"
    code, out, _ = cli(capsys, "show", "zb-h2", "-p", 4, "-m", 8, "--f", 1, "--b", 3, "--w", 1, "--json")
    path.write_text(out)
    _, with_costs, _ = cli(capsys, "export-torch", "zb-h2", "-p", 4, "-m", 8, "--f", 1, "--b", 3, "--w", 1)
    _, from_file, _ = cli(capsys, "export-torch", path)
    _, unit_costs, _ = cli(capsys, "export-torch", "zb-h2", "-p", 4, "-m", 8)
    assert with_costs == from_file != unit_costs  # the costs change zb-h2's order
    assert list(csv.reader(io.StringIO(with_costs)))


def test_a_schedule_over_the_memory_budget_is_refused_with_its_peak(capsys):
    code, _, err = cli(capsys, "simulate", "zb-h2", "-p", 4, "-m", 8, "--max-activations", 4)
    assert code == 2 and "zb-h2 does not fit" in err and "holds 7 microbatches" in err
    assert simulated(capsys, "zb-auto", "-p", 4, "-m", 8, "--max-activations", 4)["makespan"] > 0


def test_the_readme_first_sweep_shows_activations_not_zero_bytes(capsys):
    code, out, _ = cli(capsys, "sweep", "-p", 4, "--microbatches", 16, "--f", 1, "--b", 2, "--w", 1)
    assert code == 0 and "0 B" not in out
    line = next(x for x in out.splitlines() if x.startswith("1f1b "))
    assert line.split()[1:4] == ["4", "1", "16"] and line.split()[-1] == "4"  # microbatches of activations
    assert "activations (microbatches)" in out and not re.search(r"\bmb\b", out)  # not to be read as megabytes


def test_sweep_varies_p_and_v_and_writes_v_in_the_csv(capsys, tmp_path):
    table = tmp_path / "s.csv"
    code, out, _ = cli(capsys, "sweep", "-p", "2,4", "-v", "1,2", "-m", 8, "--schedules", "interleaved-1f1b,zb-v",
                       "--csv", table)
    assert code == 0
    rows = list(csv.DictReader(table.open()))
    assert [(r["schedule"], r["ranks"], r["v"]) for r in rows] == [
        ("interleaved-1f1b", "2", "1"), ("interleaved-1f1b", "2", "2"), ("zb-v", "2", "2"),
        ("interleaved-1f1b", "4", "1"), ("interleaved-1f1b", "4", "2"), ("zb-v", "4", "2")]
    assert [r["peak_activations"] for r in rows if r["schedule"] == "zb-v"] == ["2.0", "4.0"]


def pareto_entries(out):
    """The Pareto front's entries as printed, one per candidate."""
    line = next(x for x in out.splitlines() if x.startswith("Pareto front"))
    return re.findall(r"(\S+(?: \+R)? m=\d+ v=\d+) \(", line.split(": ", 1)[1])


def test_plan_pareto_front_marks_recomputation_and_names_each_candidate_once(capsys):
    args = ["plan", "-p", 4, "-m", 16, "-v", 2, "--max-activations", 3, "--f", 1, "--b", 2, "--w", 1]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    code, doc, err = cli(capsys, *args, "--json")
    front = json.loads(doc)["pareto"]
    entries = pareto_entries(out)
    assert len(entries) == len(front) == len(set(entries))  # none printed alike
    assert [" +R " in e + " " for e in entries] == [c["recompute"] for c in front]
    assert any(c["recompute"] for c in front)
    assert not re.search(r"\bmb\b", out) and "microbatches of activations" in out


def test_plan_says_when_memory_is_not_modelled_so_a_byte_limit_cannot_bind(capsys):
    code, out, err = cli(capsys, "plan", "-p", 4, "-m", 8, "--f", 1, "--b", 1, "--w", 1, "--memory-limit", "1KiB")
    assert code == 0, err
    assert "memory is not modelled" in out and "cannot bind" in out
    code, out, err = cli(capsys, "plan", "-p", 4, "-m", 8, *USER, *MEMORY, "--memory-limit", "40GiB")
    assert code == 0 and "not modelled" not in out


def test_plan_from_the_library_ranks_what_fits():
    costs = ps.uniform_costs(1, 2, 1)
    result = ps.plan(4, [8, 16], costs=costs, chunks=2, max_activations=3)
    assert isinstance(result, ps.Plan) and result.best is result.fitting[0]
    assert all(c.result.peak_activations <= 3 for c in result.fitting)
    assert result.best.throughput() == max(c.throughput() for c in result.fitting)
    assert not result.memory_modelled and {c.recompute for c in result.candidates} == {False, True}  # auto: both
    again = ps.metrics(ps.simulate(result.best.result.schedule, costs))
    assert again.makespan == pytest.approx(result.best.result.makespan)
    assert all(c.result.peak_activations <= 3 for c in result.pareto)


@pytest.mark.parametrize("kwargs,message", [
    ({"ranks": 0}, "ranks must be an integer >= 1"),
    ({"microbatches": [8, 0]}, "microbatches must be"),
    ({"chunks": "12"}, "chunks must be"),
    ({"memory_limit": -1.0}, "memory_limit must be"),
    ({"max_activations": 0.5}, "max_activations must be"),
    ({"recompute": "sometimes"}, "recompute must be"),
    ({"schedules": ["nope"]}, "unknown schedule 'nope'"),
    ({"microbatch_size": 0}, "microbatch_size must be"),
    ({"processes": 0}, "processes must be"),
])
def test_plan_from_the_library_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ps.plan(**{"ranks": 4, "microbatches": 8, **kwargs})


def test_plan_from_the_library_says_when_nothing_fits():
    costs = ps.uniform_costs(1, 1, 1, activation_memory=2 * 2 ** 30, param_bytes=4 * 2 ** 30)
    with pytest.raises(ps.BudgetError, match="no schedule fits"):
        ps.plan(4, 8, costs=costs, memory_limit=4.5 * 2 ** 30)


def test_sweep_from_the_library_is_what_the_command_prints():
    rows = ps.sweep(4, 16, ["1f1b", "zb-v", "dualpipe"], costs=ps.uniform_costs(1, 2, 1))
    assert [(r.point.schedule, r.v, r.activations) for r in rows] == [("1f1b", 1, 4), ("zb-v", 2, 4), ("dualpipe", 1, 5)]
    assert [r.point.makespan for r in rows] == [76, 67, 67] and all(r.fits for r in rows)
    both = ps.sweep([2, 4], [8], ["1f1b"], recompute="both", max_activations=3)
    assert [(r.point.ranks, r.point.schedule, r.fits) for r in both] == [
        (2, "1f1b", True), (2, "1f1b+recompute", True), (4, "1f1b", False), (4, "1f1b+recompute", True)]
    for bad, message in (({"engine": "fast"}, "engine must be"), ({"chunks": 0}, "chunks must be"),
                         ({"schedules": []}, "schedules is empty")):
        with pytest.raises(ValueError, match=message):
            ps.sweep(4, 8, **bad)
