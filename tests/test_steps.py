"""Steps back to back (simulator.steps, simulator.period): the steady-state period of a
step repeated with and without a barrier, against closed forms and against K steps
simulated one after another, on both engines; the K-step Trace; metrics; the CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipesched.cli import main
from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, CostModel, DataParallel, HostSharing, Link, Network, StageCost, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.period import apply, critical_nodes, max_cycle_mean
from pipesched.simulator.shared_grads import shared_sums
from pipesched.simulator.steps import MAX_STEPS, step_matrix, steady_period
from pipesched.simulator.timing import resolve
from pipesched.simulator.trace import COMPUTE, Trace

NEG = -math.inf


def costs(f=1.0, b=1.0, w=1.0, **extra) -> CostModel:
    """One stage's F, B, W (seconds) and the extra StageCost and CostModel fields."""
    stage = {k: v for k, v in extra.items() if k in StageCost.__dataclass_fields__}
    return CostModel(stages=(StageCost(f, b, w, **stage),), **{k: v for k, v in extra.items() if k not in stage})


COMM = dict(activation_bytes=1e6, network=Network(Link(0.05, 2e7)))  # 0.1 s a transfer
TAIL = dict(optimizer_time=0.7, weight_grad_bytes=4e7, data_parallel=DataParallel(4, 1e-3, 1e8, 1.5e7))
COSTS = {
    "equal": costs(),
    "unequal": costs(1.0, 2.0, 1.0),
    "unequal 2,3,1": costs(2.0, 3.0, 1.0),
    "comm": costs(1.0, 1.2, 0.8, **COMM),
    "comm + dp tail": costs(1.0, 1.2, 0.8, **COMM, **TAIL),
}
SCHEDULES = [("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2), ("dualpipev", 2), ("interleaved-1f1b", 2),
             ("gpipe", 1), ("dualpipe", 1), ("v-half", 2)]


# --- the max-cycle mean -------------------------------------------------------------

def test_karp_on_small_graphs():
    assert max_cycle_mean([[3.0]]) == 3.0
    # 0 -> 1 (weight 1), 1 -> 0 (weight 5): cycle mean 3; self-loop on 1 of 2.5
    a = np.array([[NEG, 5.0], [1.0, 2.5]])
    assert max_cycle_mean(a) == 3.0 and critical_nodes(a) == [0, 1]
    a[1, 1] = 4.0
    assert max_cycle_mean(a) == 4.0 and critical_nodes(a) == [1]
    # no cycle at all; a node only reached, never on a cycle
    assert max_cycle_mean([[NEG, 1.0], [NEG, NEG]]) == NEG
    assert max_cycle_mean([[2.0, NEG], [7.0, NEG]]) == 2.0
    # the growth of x(k+1) = A x(k) is the max cycle mean: once periodic (a cycle of
    # length c <= n repeats, c divides 60 for n <= 6), 60 steps grow by 60 lambda
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 7))
        a = np.where(rng.random((n, n)) < 0.5, rng.random((n, n)) * 10, NEG)
        np.fill_diagonal(a, rng.random(n))
        x = np.zeros(n)
        for _ in range(3000):
            x = apply(a, x)
        y = x
        for _ in range(60):
            y = apply(a, y)
        assert (y.max() - x.max()) / 60 == pytest.approx(max_cycle_mean(a), rel=1e-9)


@pytest.mark.parametrize("bad", [np.zeros((0, 0)), np.zeros((2, 3)), [[math.nan]], [[math.inf]]])
def test_karp_refuses_bad_matrices(bad):
    with pytest.raises(ValueError):
        max_cycle_mean(bad)


# --- closed forms (F = B = W = 1, no communication) ------------------------------------

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 24), (3, 2)])
def test_1f1b_period_is_its_makespan_with_or_without_a_barrier(p, m):
    # rank 0 runs the step's first F and its last BW: its own step is the whole
    # makespan, so it cannot start the next step earlier: (m+p-1)(F+B+W) either way
    for name in ("1f1b", "gpipe"):
        graph = validate(build(name, p, m))
        assert steady_period(graph, uniform(), "all") == (m + p - 1) * 3
        assert steady_period(graph, uniform(), "none") == (m + p - 1) * 3


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 24)])
def test_zero_bubble_periods(p, m):
    # ZB-H1 ends on rank 0 as 1F1B does: m(F+B+W) + (p-1)(F+B-W) either way. ZB-H2
    # and ZB-V leave the last Ws to the later ranks: without a barrier rank 0 starts
    # the next step while they drain, and every rank is busy all the time: m(F+B+W)
    g = {name: validate(build(name, p, m)) for name in ("zb-h1", "zb-h2", "zb-v")}
    assert steady_period(g["zb-h1"], uniform(), "none") == steady_period(g["zb-h1"], uniform(), "all") == 3 * m + p - 1
    assert steady_period(g["zb-h2"], uniform(), "all") == 3 * m + p - 1
    assert steady_period(g["zb-v"], uniform(), "all") == 3 * m + (p - 1) / 2
    assert steady_period(g["zb-h2"], uniform(), "none") == steady_period(g["zb-v"], uniform(), "none") == 3 * m


@pytest.mark.parametrize("name,v", SCHEDULES)
@pytest.mark.parametrize("cost", list(COSTS))
def test_period_bounds(name, v, cost):
    # no faster than the busiest rank's work per step; no slower than with a barrier
    c = COSTS[cost]
    graph = validate(build(name, 4, 8))
    trace = simulate(graph, c, engine="exact")
    busy = max(r.busy for r in compute_metrics(trace).per_rank)
    none, barrier = steady_period(graph, c, "none"), steady_period(graph, c, "all")
    assert busy - 1e-9 <= none <= barrier + 1e-9
    makespan = compute_metrics(trace).makespan
    sums = shared_sums(graph.schedule, resolve(graph, c).stage_costs, c.network, c.host_overhead)
    if sums is None:
        assert barrier == pytest.approx(makespan, rel=1e-12)
    else:  # DualPipe's replicas sum their gradients after the pipeline and the all-reduces: two messages at
        # most on the critical path, and the optimizer steps (which follow the sums) may move after them
        most = 2 * max(c.network.intra.time(g.nbytes) for g in sums.groups)
        stage_costs = resolve(graph, c).stage_costs
        optimizer = max(sum(stage_costs[st.model_stage].optimizer_time for st in graph.schedule.stages
                            if st.rank == r) for r in range(graph.schedule.ranks))
        assert makespan - 1e-9 <= barrier <= makespan + most + optimizer + 1e-9


# --- the period against K steps simulated --------------------------------------------

def steady_steps(ends: list[float], period: float, most: int) -> bool:
    """Whether the last steps repeat with the period: t_K - t_(K-c) = c x period for a cycle c <= most."""
    k = len(ends) - 1
    return any(math.isclose(ends[k] - ends[k - c], c * period, rel_tol=1e-9, abs_tol=1e-9)
               for c in range(1, min(most, k) + 1))


@pytest.mark.parametrize("name,v", SCHEDULES)
@pytest.mark.parametrize("cost", list(COSTS))
def test_max_plus_period_is_what_k_steps_converge_to(name, v, cost):
    c = COSTS[cost]
    schedule = build(name, 4, 8)
    k = 24
    trace = simulate(schedule, c, steps=k, step_barrier="none", engine="exact")
    info = trace.meta["steps"]
    assert info["period_method"] == "max-plus" and info["count"] == k and info["barrier"] == "none"
    ends = info["ends"]
    period = info["period"]
    assert steady_steps(ends, period, 8), (ends[-4:], period)
    assert (ends[-1] - ends[0]) / (k - 1) == pytest.approx(period, rel=0.05)
    # the first step from every rank free at 0 is A applied to 0
    graph = validate(schedule)
    matrix = step_matrix(graph, resolve(graph, c), c)
    p = schedule.ranks
    assert ends[0] == pytest.approx(apply(matrix.a, np.zeros(len(matrix.names)))[:p].max(), rel=1e-12)
    # with a barrier every step is the first shifted
    barrier = simulate(schedule, c, steps=3, engine="exact").meta["steps"]
    assert barrier["ends"] == pytest.approx([barrier["period"] * i for i in (1, 2, 3)], rel=1e-12)
    assert barrier["period"] == pytest.approx(matrix.barrier_period(), rel=1e-12)


@pytest.mark.parametrize("name", ["1f1b", "zb-h2", "zb-v", "dualpipev", "interleaved-1f1b", "dualpipe"])
@pytest.mark.parametrize("cost", ["equal", "comm", "comm + dp tail"])
def test_des_and_exact_agree_over_k_steps(name, cost):
    c = COSTS[cost]
    schedule = build(name, 4, 8)
    for barrier in ("all", "none"):
        a = simulate(schedule, c, steps=4, step_barrier=barrier, engine="exact")
        b = simulate(schedule, c, steps=4, step_barrier=barrier, engine="des")
        assert np.allclose(a.start, b.start, atol=1e-9) and np.allclose(a.end, b.end, atol=1e-9)
        assert a.meta["steps"]["ends"] == pytest.approx(b.meta["steps"]["ends"], abs=1e-9)
        assert a.meta["steps"]["period"] == b.meta["steps"]["period"]


def test_blocking_sends_and_host_time_are_in_the_period():
    from dataclasses import replace

    from pipesched.simulator.costs import HostOverhead

    c = replace(COSTS["comm"], blocking_sends=True, host_overhead=HostOverhead(per_op=0.01, per_send=0.002))
    for name in ("zb-h2", "zb-v"):
        trace = simulate(build(name, 4, 8), c, steps=20, step_barrier="none", engine="exact")
        info = trace.meta["steps"]
        assert steady_steps(info["ends"], info["period"], 8)
        des = simulate(build(name, 4, 8), c, steps=3, step_barrier="none", engine="des")
        assert des.meta["steps"]["ends"] == pytest.approx(info["ends"][:3], abs=1e-9)


def test_ranks_sharing_compute_are_simulated_step_by_step():
    c = CostModel(stages=(StageCost(1.0, 1.0, 1.0),), host=HostSharing(2.0))
    trace = simulate(build("zb-h2", 4, 8), c, steps=2, step_barrier="none")
    info = trace.meta["steps"]
    assert info["period_method"] == "simulated" and info["count"] == 2 and len(info["ends"]) == 2
    # four ranks on two cores, 24 s of work each a step: 48 s a step at least, and the
    # next step's forwards fill the cores the last Ws leave
    one = compute_metrics(simulate(build("zb-h2", 4, 8), c)).makespan
    assert 48 - 1e-9 <= info["period"] < one
    assert trace.microbatches == 16 and info["ends"][1] >= 2 * 48 - 1e-9
    with pytest.raises(CostError, match="without the step's tail"):
        simulate(build("zb-h2", 2, 4), CostModel(host=HostSharing(1.0), data_parallel=DataParallel(2)),
                 step_barrier="none")
    assert simulate(build("zb-h2", 2, 4), CostModel(host=HostSharing(1.0), data_parallel=DataParallel(2)),
                    steps=2).meta["steps"]["period_method"] == "barrier"


# --- the K-step trace ----------------------------------------------------------------

def test_k_step_trace_numbers_microbatches_and_sums_memory(tmp_path):
    c = costs(1.0, 1.2, 0.8, activation_memory=1e9, param_bytes=3e9, **COMM, comm_buffers=True)
    schedule = build("zb-v", 4, 8)
    one = simulate(schedule, c)
    three = simulate(schedule, c, steps=3, step_barrier="none")
    assert three.microbatches == 24
    comp = three.lane == COMPUTE
    assert sorted(set(three.mb[comp].tolist())) == list(range(24))
    assert (three.lane == COMPUTE).sum() == 3 * (one.lane == COMPUTE).sum()
    for r in range(4):
        t, levels = three.memory[r]
        assert levels[0] == levels[-1] == one.memory[r][1][0] == 3e9  # the parameters; all else released
        assert (np.diff(t) >= 0).all()
        assert levels.max() >= one.memory[r][1].max() - 1e-6
    again = Trace.load(_saved(three, tmp_path / "t.json"))
    m = compute_metrics(again, validate(schedule))
    assert m.steps == 3 and m.step_barrier == "none" and m.period == three.meta["steps"]["period"]
    assert m.throughput == pytest.approx(8 / m.period)
    assert m.step_makespan == pytest.approx(compute_metrics(one).makespan)
    assert m.critical_path and m.critical_path[-1].end <= m.step_makespan + 1e-9  # the first step's


def _saved(trace: Trace, path) -> str:
    trace.save(path)
    return str(path)


def test_metrics_of_one_step_have_no_period():
    m = compute_metrics(simulate(build("1f1b", 2, 4), uniform()))
    assert m.steps == 1 and m.period is None and m.throughput is None
    m = compute_metrics(simulate(build("zb-v", 2, 4), uniform(), step_barrier="none"))
    assert m.steps == 1 and m.period == 12.0 and m.throughput == 4 / 12.0


@pytest.mark.parametrize("kwargs,message", [
    ({"steps": 0}, "steps must be"), ({"steps": MAX_STEPS + 1}, "steps must be"), ({"steps": 2.0}, "steps must be"),
    ({"step_barrier": "some"}, "step_barrier"), ({"steps": 2, "noise_cv": 0.1}, "noise"),
    ({"steps": 2, "task_times": np.ones(16)}, "task_times"),
])
def test_simulate_checks_its_step_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(build("1f1b", 2, 4), uniform(), **kwargs)


# --- the command line ----------------------------------------------------------------

def cli(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_prints_period_and_throughput(capsys, tmp_path):
    code, out, _ = cli(capsys, "simulate", "zb-v", "-p", 4, "-m", 8, "--steps", 2, "--step-barrier", "none",
                       "--plot", tmp_path / "two.png")
    assert code == 0
    assert "2 steps, barrier none: period 24 s per step (exact, max-plus) against a one-step makespan of 25.5 s, " \
           "throughput 0.3333 microbatches/s" in out
    assert (tmp_path / "two.png").read_bytes()[:4] == b"\x89PNG"
    code, out, _ = cli(capsys, "simulate", "zb-v", "-p", 4, "-m", 8, "--step-barrier", "none", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["period"] == 24 and doc["makespan"] == 25.5 and doc["period_method"] == "max-plus"
    assert doc["throughput"] == pytest.approx(8 / 24) and doc["steps"] == 1
    code, out, _ = cli(capsys, "simulate", "1f1b", "-p", 4, "-m", 8, "--json")
    assert json.loads(out)["period"] is None


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipe"])
@pytest.mark.parametrize("barrier", ["all", "none"])
def test_the_critical_path_of_many_steps_is_the_first_steps(capsys, name, barrier):
    """Eight steps with transfers: the later steps' sends are not taken for the first step's."""
    common = [name, "-p", 4, "-m", 8, "--f", "1ms", "--b", "1ms", "--w", "1ms", "--latency", "1ms", "--json"]
    code, out, err = cli(capsys, "simulate", *common, "--steps", 8, "--step-barrier", barrier)
    assert code == 0, err
    code, one, err = cli(capsys, "simulate", *common)
    assert code == 0, err
    assert json.loads(out)["critical_path"] == json.loads(one)["critical_path"]


@pytest.mark.parametrize("args,message", [
    (["--steps", "0"], "--steps must be between 1 and 1000"),
    (["--steps", "100000"], "--steps must be between 1 and 1000"),
    (["--steps", "x"], "--steps"),
    (["--step-barrier", "sometimes"], "--step-barrier"),
])
def test_bad_step_arguments_are_one_line_and_exit_2(capsys, args, message):
    code, _, err = cli(capsys, "simulate", "1f1b", "-p", 2, "-m", 4, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_sweep_shows_the_period_without_a_barrier(capsys):
    code, out, _ = cli(capsys, "sweep", "-p", 4, "-m", 8, "--schedules", "1f1b,zb-h2", "--step-barrier", "none")
    assert code == 0
    lines = out.splitlines()
    assert "period" in lines[0]
    assert lines[1].split()[4:8] == ["33", "s", "33", "s"] and lines[2].split()[4:8] == ["27", "s", "24", "s"]
    code, out, _ = cli(capsys, "sweep", "-p", 4, "-m", 8, "--schedules", "1f1b")
    assert "period" not in out


def test_plan_ranks_by_microbatches_per_period_without_a_barrier(capsys):
    args = ["plan", "-p", 4, "-m", 8, "--schedules", "zb-h2,zb-v,1f1b", "-v", "1,2", "--json"]
    code, out, _ = cli(capsys, *args)
    assert code == 0 and json.loads(out)["best"]["schedule"] == "zb-v"  # 25.5 s against zb-h2's 27
    code, out, _ = cli(capsys, *args, "--step-barrier", "none")
    doc = json.loads(out)
    ranked = [(c["schedule"], c["period"], c["throughput"]) for c in doc["candidates"]]
    assert ("zb-h2", 24.0, 8 / 24) in ranked and ("1f1b", 33.0, 8 / 33) in ranked
    assert doc["best"]["period"] == 24.0 and doc["best"]["throughput"] == 8 / 24
    code, out, _ = cli(capsys, *args[:-1], "--step-barrier", "none")
    assert code == 0 and "period 24 s without a barrier" in out


def test_the_benchmark_prints_every_built_in_with_and_without_the_barrier(capsys):
    from helpers import benchmark_module

    benchmark_module("step_barrier").simulated(4, 8)
    equal = capsys.readouterr().out.split("F,B,W = 1,2,1")[0]  # the first block: F = B = W = 1
    rows = {line.split()[0]: line.split() for line in equal.splitlines() if line.startswith(("zb-h2 ", "1f1b "))}
    assert rows["1f1b"][1:6] == ["27.27%", "33s", "27.27%", "33s", "1.000"]
    assert rows["zb-h2"][1:6] == ["0.00%", "27s", "0.00%", "24s", "0.889"]
