"""When a rank posts each receive: the rule the executor follows and the simulator models.

gloo completes a send only after the receiver has posted the matching receive; a send
that finds none waits for the sender's communication thread to see the receive arrive
later, and that thread competes for a core with the sender's compute (milliseconds
lost per transfer; docs/executor.md has the measurements). So a receive should be posted before its sender
sends, but not much earlier, since a posted receive holds its buffer.

The rule: the receive for a transfer is posted before the receiver's unit that starts
last, no later than the producing op starts, in a unit-time run of the schedule (F, B
and W take 1, BW 2, transfers nothing), and at least `lookahead` units before the
consumer; with lookahead < 0 all receives are posted at the start.
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.timeline import unit_time_starts


def first_task_of_units(graph: TaskGraph) -> np.ndarray:
    """Each unit's first task id (a unit's tasks are consecutive ids)."""
    size = np.bincount(graph.columns()["unit"], minlength=len(graph.units))
    return np.cumsum(size) - size


def receive_posts(graph: TaskGraph, lookahead: int) -> np.ndarray:
    """For every edge, the position in the receiver's program of the unit before which
    its receive is posted (-1 for local edges)."""
    col = graph.columns()
    posts = np.full(len(graph.edges), -1, dtype=np.int64)
    xfer = np.flatnonzero(col["edge_kind"] != LOCAL)
    if lookahead < 0:
        posts[xfer] = 0
        return posts
    starts = unit_time_starts(graph)
    producer, consumer = col["unit"][col["edge_src"][xfer]], col["unit"][col["edge_dst"][xfer]]
    receiver = col["rank"][col["edge_dst"][xfer]]
    first = np.asarray([ids[0] if ids else 0 for ids in graph.rank_units], dtype=np.int64)
    position = consumer - first[receiver]  # a rank's units are consecutive ids, in program order
    # the receiver's last unit starting no later than the producer, in the unit-time run: unit-time
    # starts are whole numbers, so shifting rank r's by r * span keeps them exact and puts every
    # rank's (increasing) starts in one increasing array
    span = float(starts.max(initial=0.0)) + 1.0
    shifted = starts + col["rank"][first_task_of_units(graph)] * span
    before_producer = np.searchsorted(shifted, starts[producer] + receiver * span, "right") - 1 - first[receiver]
    posts[xfer] = np.maximum(0, np.minimum(position - lookahead, before_producer))
    return posts
