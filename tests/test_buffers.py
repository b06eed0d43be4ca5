"""Communication buffers in the predicted memory: what the executor holds besides
activations (receive buffers from posting to use, send buffers until sent, V-turn
hand-overs until taken)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pipesched.schedules.graph import LOCAL
from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.cost_file import from_dict, load, to_dict
from pipesched.simulator.costs import CostError, Link, Network, uniform
from pipesched.simulator.exact import longest_path
from pipesched.simulator.memory import buffer_intervals
from pipesched.simulator.posting import receive_posts, unit_time_starts
from pipesched.simulator.timing import resolve


def levels(trace, rank):
    times, values = trace.memory[rank]
    return [(float(t), float(v)) for t, v in zip(times, values)]


def test_one_microbatch_on_two_ranks_holds_exactly_the_posted_and_sent_buffers():
    # F = B = W = 1, one transfer of 10 bytes takes 0.5 s; receives posted at the start
    costs = uniform(1, 1, 1, activation_bytes=10, network=Network(Link(0.5)), recv_lookahead=-1)
    trace = simulate(build("1f1b", 2, 1), costs)
    # rank 0: gradient receive posted at 0 until BW starts at 5; its send of F0 from 1 to 1.5
    assert levels(trace, 0) == [(0.0, 0.0), (0.0, 10.0), (1.0, 20.0), (1.5, 10.0), (5.0, 0.0)]
    # rank 1: activation receive from 0 until F starts at 1.5; the gradient sent from 4.5 to 5
    assert levels(trace, 1) == [(0.0, 0.0), (0.0, 10.0), (1.5, 0.0), (4.5, 10.0), (5.0, 0.0)]


def test_with_no_lookahead_a_receive_is_still_posted_before_its_sender_starts_producing():
    costs = uniform(1, 1, 1, activation_bytes=10, network=Network(Link(0.5)), recv_lookahead=0)
    trace = simulate(build("1f1b", 2, 1), costs)
    # rank 1 starts the BW that sends rank 0 its gradient (unit time 2) before rank 0 would
    # reach its BW (unit time 4): rank 0 posts the receive at the start, not after its F
    assert levels(trace, 0)[:3] == [(0.0, 0.0), (0.0, 10.0), (1.0, 20.0)]


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v", "dualpipe", "looped-bfs"])
@pytest.mark.parametrize("lookahead", [0, 2, 5])
def test_receives_are_posted_lookahead_units_ahead_or_before_the_producer_starts(name, lookahead):
    graph = validate(build(name, 4, 8))
    posts = receive_posts(graph, lookahead)
    starts = unit_time_starts(graph)
    position = {u: i for ids in graph.rank_units for i, u in enumerate(ids)}
    for e, edge in enumerate(graph.edges):
        if edge.kind == LOCAL:
            assert posts[e] == -1
            continue
        consumer, producer = graph.task_unit[edge.dst], graph.task_unit[edge.src]
        ids = graph.rank_units[graph.unit_rank[consumer]]
        at = posts[e]
        assert 0 <= at <= max(0, position[consumer] - lookahead)
        assert at == 0 or starts[ids[at]] <= starts[producer]  # no later than the producer starts
        later = at + 1
        # and as late as both bounds allow
        assert later > position[consumer] - lookahead or starts[ids[later]] > starts[producer]
    assert set(receive_posts(graph, -1)) <= {-1, 0}


def test_buffers_can_be_left_out_and_then_only_activations_count():
    base = dict(activation_bytes=10, activation_memory=100, network=Network(Link(0.5)))
    with_buffers = simulate(build("1f1b", 4, 8), uniform(1, 1, 1, **base))
    without = simulate(build("1f1b", 4, 8), uniform(1, 1, 1, comm_buffers=False, **base))
    assert max(without.memory[0][1]) == 400  # p microbatches in flight on rank 0
    assert max(with_buffers.memory[0][1]) > 400
    assert all(v[-1] == 0 for _, v in with_buffers.memory)  # every buffer is released


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_v_turn_hand_overs_are_held_on_the_turning_rank_and_engines_agree(name):
    costs = uniform(1, 2, 1, activation_bytes=10, network=Network(Link(0.25)))
    schedule = build(name, 2, 4)
    des, exact = simulate(schedule, costs), simulate(schedule, costs, engine="exact")
    for r in range(2):
        assert np.array_equal(des.memory[r][1], exact.memory[r][1])
    graph = validate(schedule)
    timing = resolve(graph, costs)
    timeline = longest_path(graph, timing)
    held = list(zip(*buffer_intervals(graph, timing.edge_bytes, timing.recv_posts, timeline.unit_start,
                                      timeline.unit_end, timeline.edge_end)))
    turns = [e for e in graph.edges if e.kind == LOCAL and graph.tasks[e.src].stage != graph.tasks[e.dst].stage]
    assert len(turns) == 2 * 4  # one turn forward and one backward per microbatch
    for e in turns:  # each held on its rank from the producer's end to the consumer's start
        src, dst = graph.task_unit[e.src], graph.task_unit[e.dst]
        assert (graph.unit_rank[src], timeline.unit_end[src], timeline.unit_start[dst], 10) in held


def test_cost_files_carry_the_buffer_settings(tmp_path):
    costs = uniform(1, 1, 1, comm_buffers=False, recv_lookahead=-1)
    again = from_dict(json.loads(json.dumps(to_dict(costs))))
    assert again.comm_buffers is False and again.recv_lookahead == -1
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "pipesched.costs/1", "recv_lookahead": 1.5}))
    with pytest.raises(CostError, match="recv_lookahead"):
        load(path)
    path.write_text(json.dumps({"format": "pipesched.costs/1", "comm_buffers": "yes"}))
    with pytest.raises(CostError, match="comm_buffers"):
        load(path)
