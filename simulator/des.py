"""The discrete-event simulation, in simpy's process style.

One process per rank walks its program on one compute stream: it waits for the
inputs of the next unit, computes, then hands each output to its link and moves on
(asynchronous sends; with blocking sends it waits until the transfer is done).
Receives are posted ahead, so a transfer starts as soon as its link is free. One
process per directed link serves transfers one at a time in the order they were sent
(contention); without contention every transfer gets its own process.

Semantics match `simulator.exact`, which computes the same timeline as a longest path
when nothing is shared; the DES is the engine that can also share compute between
ranks (`simulator.sharing`) and takes per-op noise.
"""
from __future__ import annotations

import math
from typing import Callable, Generator

import simpy

from schedules.graph import TaskGraph

from .timing import Timeline, Timing

# compute(env, rank, seconds) -> a simpy process that ends when the op is done
Compute = Callable[[simpy.Environment, int, float], Generator]


def run_des(graph: TaskGraph, timing: Timing, compute: Compute | None = None) -> Timeline:
    """Simulate the schedule; `compute` replaces the default dedicated compute per rank."""
    env = simpy.Environment()
    n_units, n_edges = len(graph.units), len(graph.edges)
    unit_start = [0.0] * n_units
    unit_end = [0.0] * n_units
    edge_start = [math.nan] * n_edges
    edge_end = [math.nan] * n_edges
    arrived = [env.event() if link >= 0 else None for link in timing.edge_link]
    queues = [simpy.Store(env) for _ in timing.links] if timing.contention else []

    def transfer(e: int) -> Generator:
        edge_start[e] = env.now
        yield env.timeout(timing.edge_time[e])
        edge_end[e] = env.now
        arrived[e].succeed()

    def link(queue: simpy.Store) -> Generator:
        while True:
            e = yield queue.get()
            yield from transfer(e)

    def rank(r: int) -> Generator:
        for u in graph.rank_units[r]:
            members = graph.units[u]
            for t in members:
                for e in graph.task_inputs[t]:
                    ev = arrived[e]
                    if ev is not None and not ev.processed:
                        yield ev
            unit_start[u] = env.now
            if compute is None:
                yield env.timeout(timing.unit_time[u])
            else:
                yield env.process(compute(env, r, timing.unit_time[u]))
            unit_end[u] = env.now
            sent = []
            for t in members:
                for e in graph.task_outputs[t]:
                    link_id = timing.edge_link[e]
                    if link_id < 0:
                        continue
                    if timing.contention:
                        queues[link_id].put(e)
                    else:
                        env.process(transfer(e))
                    sent.append(arrived[e])
            if timing.blocking_sends:
                for ev in sent:
                    if not ev.processed:
                        yield ev

    for q in queues:
        env.process(link(q))
    for r in range(graph.schedule.ranks):
        env.process(rank(r))
    env.run()
    return Timeline(unit_start, unit_end, edge_start, edge_end)
