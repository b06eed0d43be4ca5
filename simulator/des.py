"""The discrete-event simulation, in simpy's process style.

One process per rank walks its program on one compute stream: it waits for the
inputs of the next unit, computes, then hands each output to its link and moves on
(asynchronous sends; with blocking sends it waits until the transfer is done).
Receives are posted ahead, so a transfer starts as soon as its link is free. A
directed link serves transfers one at a time in the order they were sent
(contention), so a transfer's start is known when it is sent: the link is kept as the
time it becomes free, and the transfer is one scheduled arrival event rather than a
process of its own, which keeps large simulations fast.

Semantics match `simulator.exact`, which computes the same timeline as a longest path
when nothing is shared; the DES is the engine that can also share compute between
ranks (`simulator.sharing`).
"""
from __future__ import annotations

import math
from typing import Generator

import numpy as np
import simpy

from pipesched.schedules.graph import TaskGraph

from .costs import HostSharing
from .sharing import DONE, SharedHost
from .timing import Timeline, Timing


class Arrival(simpy.Event):
    """Data arriving at a receiver; scheduled for a known time once it is sent."""

    def at(self, delay: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, simpy.events.NORMAL, delay)


def run_des(graph: TaskGraph, timing: Timing, sharing: HostSharing | None = None,
            ready: np.ndarray | None = None, link_ready: np.ndarray | None = None) -> Timeline:
    """Simulate the schedule; with `sharing`, the ranks share one host's compute.
    `ready`: per rank, when it may start its first unit (seconds >= 0, default 0);
    `link_ready`: per link of `timing.links`, when it is first free (default 0). The
    Timeline's `rank_free` and `link_free` say when each rank and link is free after
    the step (as `simulator.exact.longest_path`). With `sharing`, a rank that has not
    started yet counts as waiting."""
    env = simpy.Environment()
    host = SharedHost(env, graph.schedule.ranks, sharing) if sharing is not None else None
    n_units, n_edges = len(graph.units), len(graph.edges)
    unit_start = [0.0] * n_units
    unit_end = [0.0] * n_units
    edge_start = [math.nan] * n_edges
    edge_end = [math.nan] * n_edges
    # plain lists: simpy steps one op at a time, and list items are faster than numpy scalars
    edge_link, edge_time = timing.edge_link.tolist(), timing.edge_time.tolist()
    task_time, unit_time, task_offset = timing.task_time.tolist(), timing.unit_time.tolist(), timing.task_offset.tolist()
    arrived = [Arrival(env) if link >= 0 else None for link in edge_link]
    link_free = [0.0] * len(timing.links) if link_ready is None else [float(x) for x in link_ready]
    rank_free = [0.0] * graph.schedule.ranks if ready is None else [float(x) for x in ready]
    contention, blocking = timing.contention, timing.blocking_sends
    if timing.host is not None:
        h = timing.host
        pre, post, offset, take = h.pre.tolist(), h.post.tolist(), h.send_offset.tolist(), h.take.tolist()
    else:
        pre = post = offset = take = None
    task_start = [0.0] * len(graph.tasks)
    task_end = [0.0] * len(graph.tasks)
    serial = timing.serial_pairs

    def send(e: int) -> Arrival:
        now = env.now
        link = edge_link[e]
        posted = now + offset[e] if offset else now
        start = max(posted, link_free[link]) if contention else posted
        end = start + edge_time[e]
        link_free[link] = end
        edge_start[e], edge_end[e] = start, end
        arrived[e].at(end - now)
        return arrived[e]

    def busy(r: int, seconds: float):
        """The rank computing for `seconds` of dedicated work (shared under a host)."""
        return env.timeout(seconds) if host is None else host.compute(r, seconds)

    def host_work(r: int, seconds: float):
        """The rank's host busy outside ops: shared with the others unless they share a
        GPU, whose ranks each have their own CPU, or it runs first (`host_time_first`)."""
        if host is None or sharing.gpu or sharing.host_time_first:
            return env.timeout(seconds)
        return host.compute(r, seconds)

    def rank(r: int) -> Generator:
        inputs, outputs, units = graph.task_inputs, graph.task_outputs, graph.units
        if rank_free[r] > 0:
            yield env.timeout(rank_free[r])
        for u in graph.rank_units[r]:
            members = units[u]
            if pre and pre[u]:
                yield host_work(r, pre[u])
            for t in members:
                for e in inputs[t]:
                    ev = arrived[e]
                    if ev is not None and not ev.processed:
                        yield ev
            if take and take[u]:
                yield host_work(r, take[u])
            unit_start[u] = env.now
            sent = []
            if serial and len(members) == 2:  # one op, its sends, the other op, its sends
                a, b = members
                task_start[a] = env.now
                yield busy(r, task_time[a])
                task_end[a] = env.now
                sent += [send(e) for e in outputs[a] if edge_link[e] >= 0]
                between = task_offset[b] - task_time[a]
                if between > 0:
                    yield busy(r, between)
                task_start[b] = env.now
                yield busy(r, task_time[b])
                task_end[b] = env.now
                sent += [send(e) for e in outputs[b] if edge_link[e] >= 0]
            else:
                yield busy(r, unit_time[u])
                for t in members:
                    task_start[t], task_end[t] = unit_start[u], env.now
                sent = [send(e) for t in members for e in outputs[t] if edge_link[e] >= 0]
            unit_end[u] = env.now
            if post and post[u]:
                yield host_work(r, post[u])
            if blocking:
                for ev in sent:
                    if not ev.processed:
                        yield ev
        rank_free[r] = max(rank_free[r], env.now)
        if host is not None:
            host.set_state(r, DONE)

    for r in range(graph.schedule.ranks):
        env.process(rank(r))
    env.run()
    return Timeline(*map(np.asarray, (unit_start, unit_end, edge_start, edge_end, task_start, task_end, rank_free,
                                      link_free)))
