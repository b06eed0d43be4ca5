"""Properties of the simulator over random schedules and costs (hypothesis): the
monotonicity and scaling a simulator must show, the two engines agreeing, and
the critical path explaining the whole makespan."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.recompute import add_recompute
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, Link, Network, StageCost, uniform

from helpers import close, run

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
times = st.floats(0.05, 3.0)


@st.composite
def cases(draw):
    """A built schedule's graph (recomputing none, all or some model stages) and a random
    cost model with communication."""
    name = draw(st.sampled_from(sorted(BUILDERS)))
    p, m = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    try:
        schedule = build(name, p, m)
    except ScheduleError:
        assume(False)
    recompute = draw(st.sampled_from([False, True, "some"]))
    if recompute == "some":
        recompute = draw(st.sets(st.integers(0, schedule.num_model_stages - 1)))
    graph = validate(add_recompute(schedule, recompute))
    stages = tuple(StageCost(draw(times), draw(times), draw(times), activation_bytes=draw(st.floats(0, 2e6)),
                             recompute_fraction=draw(st.sampled_from([1.0, 0.3])))
                   for _ in range(draw(st.sampled_from([1, p]))))
    costs = CostModel(stages=stages, overlap=draw(st.floats(0, 1)), contention=draw(st.booleans()),
                      blocking_sends=draw(st.booleans()), op_overhead=draw(st.sampled_from([0.0, 0.01])),
                      network=Network(Link(draw(st.floats(0, 0.5)), draw(st.floats(1e5, 1e8))),
                                      Link(draw(st.floats(0, 0.5)), draw(st.floats(1e5, 1e8))),
                                      ranks_per_node=draw(st.sampled_from([None, 1, 2])))).check()
    return graph, costs


def makespan(graph, costs, engine="exact"):
    return float(simulate(graph, costs, engine=engine).end.max())


def with_links(costs, change):
    net = costs.network
    return CostModel(costs.stages, costs.model_stages, costs.overlap,
                     Network(change(net.intra), change(net.inter), net.ranks_per_node),
                     costs.contention, costs.blocking_sends, costs.op_overhead).check()


@FAST
@given(case=cases(), extra=st.floats(0.0, 1.0))
def test_more_latency_never_shortens_the_makespan(case, extra):
    graph, costs = case
    slower = with_links(costs, lambda link: Link(link.latency + extra, link.bandwidth))
    assert makespan(graph, slower) >= makespan(graph, costs) * (1 - 1e-12)


@FAST
@given(case=cases(), factor=st.floats(1.0, 100.0))
def test_lower_bandwidth_never_shortens_the_makespan(case, factor):
    graph, costs = case
    slower = with_links(costs, lambda link: Link(link.latency, link.bandwidth / factor))
    assert makespan(graph, slower) >= makespan(graph, costs) * (1 - 1e-12)


@FAST
@given(case=cases(), k=st.floats(0.01, 100.0))
def test_costs_scaled_by_k_scale_the_makespan_by_k(case, k):
    graph, costs = case
    stages = tuple(replace(s, forward=s.forward * k, backward_input=s.backward_input * k,
                           backward_weight=s.backward_weight * k) for s in costs.stages)
    scaled = with_links(CostModel(stages, None, costs.overlap, costs.network, costs.contention,
                                  costs.blocking_sends, costs.op_overhead * k),
                        lambda link: Link(link.latency * k, link.bandwidth / k))
    assert close(makespan(graph, scaled), k * makespan(graph, costs))


@FAST
@given(case=cases())
def test_the_des_and_the_exact_longest_path_give_the_same_timeline(case):
    graph, costs = case
    des, exact = simulate(graph, costs, engine="des"), simulate(graph, costs, engine="exact")
    scale = max(1.0, float(exact.end.max()))
    assert np.max(np.abs(des.start - exact.start)) <= 1e-9 * scale
    assert np.max(np.abs(des.end - exact.end)) <= 1e-9 * scale


@pytest.mark.parametrize("engine", ["exact", "des"])
@pytest.mark.parametrize("variant", [{}, {"blocking_sends": True}, {"contention": False}, {"overlap": 0.5}])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_critical_path_runs_without_gaps_from_zero_to_the_makespan(name, variant, engine):
    # it used to leave a gap where a rank waited for its own blocking send, and to step
    # back to a concurrent transfer on an uncontended link
    costs = uniform(1, 2, 1, activation_bytes=1e6, network=Network(Link(0.1, 1e7)), **variant)
    metrics = run(build(name, 4, 8), costs, engine)
    path = metrics.critical_path
    assert path[0].start == 0 and close(path[-1].end, metrics.makespan)
    assert all(abs(b.start - a.end) <= 1e-9 * metrics.makespan for a, b in zip(path, path[1:]))
    if variant.get("blocking_sends"):
        assert any(s.kind == "transfer" for s in path)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (6, 12)])
def test_dualpipe_holds_exactly_twice_the_parameters_of_1f1b(p, m):
    params = uniform(1, 1, 1, param_bytes=1e9)
    dual = [r.peak_memory_bytes for r in run(build("dualpipe", p, m), params).per_rank]
    single = [r.peak_memory_bytes for r in run(build("1f1b", p, m), params).per_rank]
    assert single == [1e9] * p and dual == [2e9] * p
    # DualPipeV folds the same model into a V: one copy
    assert [r.peak_memory_bytes for r in run(build("dualpipev", p, m), params).per_rank] == [1e9] * p
