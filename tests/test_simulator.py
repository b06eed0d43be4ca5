"""The simulator: DES equals the exact longest path; monotonicity; memory; stochastic mode."""
import numpy as np
import pytest

from pipesched.schedules.recompute import add_recompute
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, Link, Network, StageCost, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.stochastic import makespan_stats, sample_makespans

from helpers import close, makespan, run

NET = Network(Link(0.05, 2e7), Link(0.4, 2e6), ranks_per_node=2)
COST_CASES = {
    "uniform": uniform(1, 1, 1),
    "comm": uniform(1, 2, 1, activation_bytes=1e6, network=NET),
    "comm-no-contention": uniform(1, 2, 1, activation_bytes=1e6, network=NET, contention=False),
    "blocking": uniform(2, 3, 1, activation_bytes=3e6, network=Network(Link(0.1, 1e7)), blocking_sends=True),
    "uneven": CostModel(stages=(StageCost(1.5, 2, 0.5, activation_bytes=2e6), StageCost(1, 1, 1, activation_bytes=1e6),
                                StageCost(1, 1, 1, activation_bytes=1e6), StageCost(0.5, 1.5, 1, activation_bytes=1e6)),
                        network=Network(Link(0.01, 1e8)), overlap=0.5, op_overhead=0.01),
}


@pytest.mark.parametrize("recompute", [False, True], ids=["", "recompute"])
@pytest.mark.parametrize("case", COST_CASES)
@pytest.mark.parametrize("name", BUILDERS)
def test_des_equals_the_exact_longest_path(name, case, recompute):
    graph = validate(add_recompute(build(name, 4, 8), recompute))
    costs = COST_CASES[case]
    des, exact = simulate(graph, costs, engine="des"), simulate(graph, costs, engine="exact")
    scale = exact.end.max()
    assert np.max(np.abs(des.start - exact.start)) <= 1e-9 * scale
    assert np.max(np.abs(np.nan_to_num(des.end - exact.end))) <= 1e-9 * scale


@pytest.mark.parametrize("name", BUILDERS)
def test_more_latency_or_less_bandwidth_never_helps(name):
    schedule = build(name, 4, 8)
    previous = 0.0
    for latency, bandwidth in [(0, 1e12), (0.01, 1e9), (0.05, 1e8), (0.2, 1e7), (0.2, 1e6)]:
        costs = uniform(1, 1, 1, activation_bytes=1e6, network=Network(Link(latency, bandwidth)))
        t = makespan(schedule, costs, engine="des")
        assert t >= previous - 1e-9
        previous = t


@pytest.mark.parametrize("name", BUILDERS)
def test_scaling_every_cost_by_k_scales_the_makespan_by_k(name):
    schedule = build(name, 4, 8)
    base = uniform(1, 2, 1, activation_bytes=1e6, network=Network(Link(0.05, 1e7)))
    scaled = uniform(3, 6, 3, activation_bytes=1e6, network=Network(Link(0.15, 1e7 / 3)))
    assert close(makespan(schedule, scaled, "des"), 3 * makespan(schedule, base, "des"))


def test_contention_queues_transfers_on_a_link():
    # gpipe's rank 0 sends m activations back to back; a slow link must serialise them
    schedule = build("gpipe", 2, 4)
    slow = dict(activation_bytes=1e6, network=Network(Link(0.0, 2e5)))  # 5 s per transfer
    with_queue = makespan(schedule, uniform(1, 1, 1, **slow))
    without = makespan(schedule, uniform(1, 1, 1, contention=False, **slow))
    # queued: activations arrive at 6, 11, 16, 21; rank 1 ends BW3 at 30; gradients
    # queue again and arrive at 29, 34, 39, 44; rank 0's last BW ends at 46
    assert close(with_queue, 46)
    # concurrent: activations arrive at 6..9, rank 1 ends at 18, gradients at 17..23
    assert close(without, 25)


def test_blocking_sends_never_help():
    for name in ("1f1b", "zb-v", "dualpipe"):
        schedule = build(name, 4, 8)
        kw = dict(activation_bytes=1e6, network=Network(Link(0.05, 1e7)))
        assert makespan(schedule, uniform(1, 1, 1, blocking_sends=True, **kw)) >= makespan(schedule, uniform(1, 1, 1, **kw))


def test_comm_hidden_fraction_and_time():
    costs = uniform(1, 1, 1, activation_bytes=1e6, network=Network(Link(0.1, 1e7)))  # 0.2 s per transfer
    metrics = run(build("1f1b", 4, 8), costs)
    transfers = 2 * 3 * 8  # activations and gradients over 3 boundaries
    assert close(metrics.comm_time, 0.2 * transfers)
    assert 0.0 < metrics.comm_hidden_fraction < 1.0


def test_bubble_ratios_match_the_definition():
    metrics = run(build("1f1b", 4, 8))
    assert close(metrics.bubble_ratio, 1 - 4 * 24 / (4 * 33))
    for r in metrics.per_rank:
        assert close(r.busy, 24) and close(r.idle, 9) and close(r.bubble_ratio, 9 / 33)


def test_critical_path_covers_the_makespan():
    costs = uniform(1, 1, 1, activation_bytes=1e6, network=Network(Link(0.1, 1e7)))
    metrics = run(build("1f1b", 4, 8), costs)
    path = metrics.critical_path
    assert path[0].start == 0 and close(path[-1].end, metrics.makespan)
    for a, b in zip(path, path[1:]):
        assert a.end <= b.start + 1e-9
    assert close(sum(s.end - s.start for s in path), metrics.makespan)  # no gaps on the critical path
    assert any(s.kind == "transfer" for s in path)


def test_memory_weight_part_is_kept_until_w():
    costs = uniform(1, 1, 1, activation_memory=10, weight_memory=4)
    split = run(build("zb-h1", 2, 4), costs).per_rank[0].peak_memory_bytes
    fused = run(build("1f1b", 2, 4), costs).per_rank[0].peak_memory_bytes
    assert fused == 20  # two microbatches in flight on rank 0
    assert split >= fused


def test_memory_samples_are_a_timeline():
    trace = simulate(build("gpipe", 2, 3), uniform(1, 1, 1, activation_memory=5, param_bytes=7))
    times, levels = trace.memory[0]
    assert levels[0] == 7 and levels.max() == 7 + 15 and levels[-1] == 7
    assert np.all(np.diff(times) >= 0)


def test_stochastic_mode_is_seeded_and_brackets_the_deterministic_makespan():
    graph = validate(build("zb-v", 4, 16))
    costs = uniform(1, 1, 1)
    a = sample_makespans(graph, costs, runs=30, cv=0.2, seed=7)
    b = sample_makespans(graph, costs, runs=30, cv=0.2, seed=7)
    assert np.array_equal(a, b)
    stats = makespan_stats(graph, costs, runs=200, cv=0.2, seed=1)
    assert stats.p95 >= stats.p50 >= stats.min
    assert stats.mean > makespan(build("zb-v", 4, 16))  # stragglers only ever delay a synchronised pipeline
    zero = sample_makespans(graph, costs, runs=3, cv=0.0)
    assert np.allclose(zero, makespan(build("zb-v", 4, 16)))
    des = sample_makespans(graph, costs, runs=3, cv=0.2, seed=3, engine="des")
    assert np.allclose(des, sample_makespans(graph, costs, runs=3, cv=0.2, seed=3))


def test_metrics_of_a_trace_loaded_from_disk(tmp_path):
    graph = validate(build("dualpipe", 4, 8))
    trace = simulate(graph, uniform(1, 1, 1, activation_bytes=1e6, network=Network(Link(0.1, 1e7))))
    trace.save(tmp_path / "t.json")
    from pipesched.simulator.trace import Trace
    again = Trace.load(tmp_path / "t.json")
    assert compute_metrics(again, graph).to_dict() == compute_metrics(trace, graph).to_dict()
