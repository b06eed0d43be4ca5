"""When a rank posts each receive: the rule the executor follows and the simulator models.

gloo completes a send only after the receiver has posted the matching receive; a send
that finds none waits for the sender's communication thread to see the receive arrive
later, and that thread competes for a core with the sender's compute (measured here:
transfers of 64 KiB held up 4-8 ms). So a receive should be posted before its sender
sends, but not much earlier, since a posted receive holds its buffer.

The rule: the receive for a transfer is posted before the receiver's unit that starts
last, no later than the producing op starts, in a unit-time run of the schedule (F, B
and W take 1, BW 2, transfers nothing), and at least `lookahead` units before the
consumer; with lookahead < 0 all receives are posted at the start.
"""
from __future__ import annotations

from bisect import bisect_right

from pipesched.schedules.graph import LOCAL, TaskGraph

from .exact import free_transfer_timeline

UNIT_COST = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0}


def unit_time_starts(graph: TaskGraph) -> list[float]:
    """Start of every unit when ops take unit time and transfers are free."""
    return free_transfer_timeline(graph, [UNIT_COST[t.op] for t in graph.tasks]).unit_start


def receive_posts(graph: TaskGraph, lookahead: int) -> list[int]:
    """For every edge, the position in the receiver's program of the unit before which
    its receive is posted (-1 for local edges)."""
    posts = [-1] * len(graph.edges)
    position = {u: i for ids in graph.rank_units for i, u in enumerate(ids)}
    starts = unit_time_starts(graph) if lookahead >= 0 else []
    rank_starts = [[starts[u] for u in ids] for ids in graph.rank_units] if starts else []
    for e, edge in enumerate(graph.edges):
        if edge.kind == LOCAL:
            continue
        if lookahead < 0:
            posts[e] = 0
            continue
        producer, consumer = graph.task_unit[edge.src], graph.task_unit[edge.dst]
        receiver = graph.unit_rank[consumer]
        before_producer = bisect_right(rank_starts[receiver], starts[producer]) - 1
        posts[e] = max(0, min(position[consumer] - lookahead, before_producer))
    return posts
