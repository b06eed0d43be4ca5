"""Activation recomputation: R ops in schedules, their cost and memory, the file formats
and the command line. Makespans and peaks are checked against formulas worked out by hand.

Why the makespan formula is not (m + p - 1)(F + R + BW): R needs only its own F, not the
gradient, so on every rank but the last it runs while the rank waits for the gradient.
The last rank runs all its ops back to back from (p-1)F on, m(F + R + BW) in all, and the
last gradient then crosses p-1 more ranks at BW each:
    makespan = m(F + R + BW) + (p-1)(F + BW)     (1F1B and GPipe, free transfers)
so recomputation adds R = F (full) to every backward on the critical path once per
microbatch. Peak memory per rank (no buffers, no parameters; A activation_memory, K what
F keeps: the input X = activation_bytes of the stage before, 0 on the first stage, or
recompute_memory):
    1F1B rank r: (p-r)A without; (p-r-1)K + A with.   GPipe rank r: mA; (m-1)K + A.
"""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipesched as ps
from pipesched.cli import main
from pipesched.schedules import fileformat, torch_format
from pipesched.schedules.activations import activations_per_rank
from pipesched.schedules.ir import R, ScheduleError, Task
from pipesched.schedules.recompute import add_recompute
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, uniform
from pipesched.simulator.perfetto import to_chrome_trace
from pipesched.simulator.trace import COMPUTE, Trace

from helpers import close, run

F_, B_, W_ = 1.0, 2.0, 1.5
BW_ = B_ + W_


def peaks(schedule, costs, engine="exact"):
    return [r.peak_memory_bytes for r in run(schedule, costs, engine).per_rank]


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 2), (4, 8), (5, 12)])
@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_recomputation_adds_r_to_every_backward_of_the_last_rank(name, p, m, fraction):
    costs = uniform(F_, B_, W_, recompute_fraction=fraction)
    r = fraction * F_
    assert close(run(build(name, p, m), costs).makespan, m * (F_ + BW_) + (p - 1) * (F_ + BW_))
    for engine in ("exact", "des"):
        got = run(add_recompute(build(name, p, m)), costs, engine).makespan
        assert close(got, m * (F_ + r + BW_) + (p - 1) * (F_ + BW_)), (engine, got)


def test_every_r_takes_the_forward_time_and_runs_right_before_its_backward():
    schedule = add_recompute(build("zb-h1", 4, 8))
    trace = simulate(schedule, uniform(F_, B_, W_))
    spans = sorted(trace.spans(COMPUTE), key=lambda s: (s.rank, s.start))
    rs = [i for i, s in enumerate(spans) if s.op == R]
    assert len(rs) == 4 * 8
    for i in rs:
        assert close(spans[i].end - spans[i].start, F_)
        nxt = spans[i + 1]
        assert (nxt.op, nxt.mb, nxt.stage, nxt.rank) == ("B", spans[i].mb, spans[i].stage, spans[i].rank)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4)])
def test_1f1b_and_gpipe_peaks_follow_the_formula(p, m):
    a, x = 1000.0, 10.0
    costs = uniform(F_, B_, W_, activation_memory=a, activation_bytes=x, comm_buffers=False)
    assert peaks(build("1f1b", p, m), costs) == [(p - r) * a for r in range(p)]
    assert peaks(add_recompute(build("1f1b", p, m)), costs) == \
        [a] + [(p - r - 1) * x + a for r in range(1, p)]
    assert peaks(build("gpipe", p, m), costs) == [m * a] * p
    assert peaks(add_recompute(build("gpipe", p, m)), costs) == [a] + [(m - 1) * x + a] * (p - 1)
    # selective: F keeps recompute_memory (bytes, any stage) and R re-creates the rest
    k = 300.0
    selective = uniform(F_, B_, W_, activation_memory=a, activation_bytes=x, comm_buffers=False,
                        recompute_memory=k, recompute_fraction=0.4)
    assert peaks(add_recompute(build("1f1b", p, m)), selective) == [(p - r - 1) * k + a for r in range(p)]


def test_only_the_chosen_stages_recompute():
    a, x = 1000.0, 10.0
    costs = uniform(F_, B_, W_, activation_memory=a, activation_bytes=x, comm_buffers=False)
    schedule = add_recompute(build("1f1b", 4, 8), [2])
    assert {t.stage for t in schedule.tasks() if t.op == R} == {2}
    assert peaks(schedule, costs) == [4 * a, 3 * a, x + a, a]
    assert activations_per_rank(schedule) == [4, 3, 1, 1]
    assert schedule.params["recompute"] == [2] and schedule.name == "1f1b+recompute"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(BUILDERS)), p=st.integers(1, 4), m=st.integers(1, 6),
       weight=st.floats(0, 1), kept=st.floats(0, 1))
def test_recomputing_never_raises_a_ranks_peak(name, p, m, weight, kept):
    """What each rank holds after each of its ops is never more with R (placed right
    before the backward) when F keeps at most what it would have stored."""
    try:
        schedule = build(name, p, m)
    except ScheduleError:
        return
    costs = uniform(F_, B_, W_, activation_memory=1000.0, weight_memory=1000.0 * weight,
                    recompute_memory=1000.0 * kept, param_bytes=5.0, comm_buffers=False)
    before, after = peaks(schedule, costs), peaks(add_recompute(schedule), costs)
    assert all(b <= a + 1e-6 for a, b in zip(before, after))
    trace = simulate(add_recompute(schedule), costs)
    assert all(levels[-1] == pytest.approx(levels[0]) for _, levels in trace.memory)  # all R held is freed


@pytest.mark.parametrize("name", BUILDERS)
def test_every_builtin_recomputes_and_round_trips_through_the_file(name, tmp_path):
    schedule = add_recompute(build(name, 4, 8))
    graph = validate(schedule)
    backwards = [t for t in graph.tasks if t.op in ("B", "BW")]
    assert sorted((t.mb, t.stage) for t in graph.tasks if t.op == R) == sorted((t.mb, t.stage) for t in backwards)
    assert add_recompute(schedule) is schedule  # idempotent
    path = tmp_path / "s.json"
    fileformat.save(schedule, path)
    again = fileformat.load(path)
    assert again.programs == schedule.programs and '"op": "R"' in path.read_text()
    trace = simulate(schedule, uniform())
    assert Trace.from_dict(json.loads(json.dumps(trace.to_dict()))).op.tolist() == trace.op.tolist()
    assert {e["cat"] for e in to_chrome_trace(trace)["traceEvents"] if e.get("ph") == "X"} >= {"F", "R"}


def test_schedule_file_mistakes_with_r_are_named():
    good = fileformat.to_dict(add_recompute(build("1f1b", 2, 2)))

    def refused(edit, message):
        doc = json.loads(json.dumps(good))
        edit(doc["programs"])
        with pytest.raises(ScheduleError, match=message):
            validate(fileformat.from_dict(doc))

    refused(lambda progs: progs[0].append({"op": "R", "mb": 0, "stage": 0}), "more than once")
    refused(lambda progs: progs[1].remove({"op": "BW", "mb": 1, "stage": 1}), r"no BW, or B and W \(its R")
    # R before its F: a deadlock, spelled out
    refused(lambda progs: progs[0].insert(0, progs[0].pop(progs[0].index({"op": "R", "mb": 0, "stage": 0}))),
            "deadlocks")


def test_torch_export_refuses_r_in_one_line(capsys):
    with pytest.raises(ScheduleError, match="torch's action format has no recompute op"):
        torch_format.to_rows(add_recompute(build("1f1b", 2, 2)))
    assert main(["export-torch", "1f1b", "-p", "2", "-m", "2", "--recompute"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch.utils.checkpoint" in err


def test_recompute_options_round_trip_through_a_cost_file(tmp_path):
    plain = uniform(1, 2, 1, activation_memory=5.0)
    assert not any(k.startswith("recompute") for k in cost_files.to_dict(plain)["stages"][0])
    costs = cost_files.from_dict({"stage": {"forward": "10ms", "recompute": True, "recompute_fraction": 0.3,
                                            "recompute_memory": "1MiB"}})
    s = costs.stages[0]
    assert s.recompute and s.op_time(R) == pytest.approx(3e-3) and s.recompute_memory == 2 ** 20
    path = tmp_path / "c.json"
    cost_files.save(costs, path)
    assert cost_files.load(path) == costs
    # per model stage: half a pipeline stage each, the kept bytes halved with it
    assert costs.model_stage_costs(2, 4)[0].recompute_memory == 2 ** 19
    assert costs.recomputed_stages(2, 4) == {0, 1, 2, 3}


@pytest.mark.parametrize("stage,message", [
    ({"recompute": "yes"}, "recompute must be true or false"),
    ({"recompute_fraction": -1}, "recompute_fraction must be finite and >= 0"),
    ({"recompute_memory": "lots"}, "recompute_memory"),
])
def test_bad_recompute_options_are_refused_in_one_line(tmp_path, capsys, stage, message):
    with pytest.raises(CostError, match=message):
        cost_files.from_dict({"stage": stage})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"stage": stage}))
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--costs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def simulated(capsys, *args):
    assert main([str(a) for a in ("simulate", *args, "--json")]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_recompute_end_to_end(capsys, tmp_path):
    flags = ["--f", "1", "--b", "2", "--w", "1.5", "--activation-memory", "1000", "--activation-bytes", "10"]
    p, m = 4, 8
    doc = simulated(capsys, "1f1b", "-p", p, "-m", m, "--recompute", *flags)
    assert close(doc["makespan"], m * (F_ + F_ + BW_) + (p - 1) * (F_ + BW_))
    # the same through a cost file marking every stage
    costs = tmp_path / "c.toml"
    costs.write_text("[stage]\nforward = 1\nbackward_input = 2\nbackward_weight = 1.5\nrecompute = true\n")
    marked = simulated(capsys, "1f1b", "-p", p, "-m", m, "--costs", costs)
    assert close(marked["makespan"], doc["makespan"]) and marked["schedule"] == "1f1b+recompute"


def test_show_writes_r_ops_and_the_file_simulates_the_same(capsys, tmp_path):
    assert main(["show", "zb-v", "-p", "2", "-m", "4", "--recompute", "--json"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "zbv.json"
    path.write_text(text)
    schedule = fileformat.load(path)
    assert sum(t.op == R for t in schedule.tasks()) == 2 * 2 * 4
    direct = simulated(capsys, "zb-v", "-p", 2, "-m", 4, "--recompute")
    from_file = simulated(capsys, path)
    assert close(direct["makespan"], from_file["makespan"])


def test_sweep_compares_with_and_without(capsys, tmp_path):
    out_csv = tmp_path / "s.csv"
    assert main(["sweep", "-p", "4", "-m", "8", "--schedules", "1f1b", "--recompute", "both",
                 "--f", "1", "--b", "2", "--w", "1.5", "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "1f1b+recompute" in out
    rows = {r.split(",")[0]: r for r in out_csv.read_text().splitlines()[1:]}
    assert set(rows) == {"1f1b", "1f1b+recompute"}


def test_plan_finds_what_fits_only_with_recomputation(capsys):
    # 1 GiB of parameters and 1 GiB per microbatch of activations: without recomputation
    # 1F1B's rank 0 holds 1 + 4 GiB; with it 1 + 1 GiB, under the 3 GiB budget
    args = ["plan", "-p", "4", "-m", "8", "--schedules", "1f1b,gpipe", "--f", "1", "--b", "1", "--w", "1",
            "--activation-memory", "1GiB", "--param-bytes", "1GiB", "--memory-limit", "3GiB"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fit only with recomputation" in out and "1f1b m=8 v=1 (2 GiB with, 5 GiB without)" in out
    assert "with recomputation with m=8" in out.split("best: ")[1]  # 1F1B and GPipe tie at 41 s
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"]["recompute"] is True
    assert {(c["schedule"], c["recompute"], c["fits"]) for c in doc["candidates"]} == {
        ("1f1b", False, False), ("1f1b", True, True), ("gpipe", False, False), ("gpipe", True, True)}
    assert main(args + ["--recompute", "off"]) == 2
    assert "no schedule fits" in capsys.readouterr().err


def test_api_build_recompute():
    assert ps.build("zb-h1", 2, 4, recompute=True).name == "zb-h1+recompute"
    some = ps.build("interleaved-1f1b", 2, 4, 2, recompute=[0, 3])
    assert {some.stages[t.stage].model_stage for t in some.tasks() if t.op == R} == {0, 3}
    with pytest.raises(ScheduleError, match="model stage 4"):
        ps.build("1f1b", 2, 4, recompute=[4])
    costs = ps.uniform_costs(1, 1, 1, activation_memory=1.0)
    fits = ps.build("gpipe", 4, 8, costs=costs, max_activations=2, recompute=True)
    assert any(t == Task(R, 0, 0) for t in fits.tasks())
    with pytest.raises(ValueError):  # m = 8 microbatches of activations without it
        ps.build("gpipe", 4, 8, costs=costs, max_activations=2)
    # ZB-H2 defers W, which still needs what R re-created: recomputing does not lower its count
    with pytest.raises(ValueError, match="holds 7 microbatches"):
        ps.build("zb-h2", 4, 8, costs=costs, max_activations=4, recompute=True)


def test_bad_recompute_flag_is_one_line(capsys):
    assert main(["sweep", "-p", "4", "-m", "8", "--recompute", "maybe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recompute" in err and "invalid choice" in err
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--recompute=yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recompute" in err


def test_figures_draw_r_in_its_own_colour(tmp_path):
    from pipesched.plots.legend import legend_handles
    from pipesched.plots.style import OP_COLORS

    trace = simulate(add_recompute(build("zb-h1", 2, 4)), uniform())
    labels = [h.get_label() for h in legend_handles([trace])]
    assert "R recompute forward" in labels
    assert OP_COLORS["R"] not in [c for op, c in OP_COLORS.items() if op != "R"]
    out = tmp_path / "rc.png"
    ps.plot(trace, out)
    assert out.stat().st_size > 0
