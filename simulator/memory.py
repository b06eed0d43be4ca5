"""Memory per rank over time: resident parameters plus stored activations.

An F stores its stage's `activation_memory` from its start; a fused BW frees it at its
end; a split B leaves `weight_memory` held at its end (what W needs, which may be more
than the F stored: B's captured gradients) and the W frees that at its end. A recomputed
stage (an R for that microbatch and virtual stage) stores only `recompute_kept` bytes
from F's start; its R adds the rest of `activation_memory` from R's start, and the
backward frees as above. With communication buffers counted (`CostModel.comm_buffers`), a transfer's payload
is held by the sender from the producing op's end until the transfer ends, and by the
receiver from the moment its receive is posted (by the executor's rule,
`simulator.posting`) until the consumer starts; a tensor handed over at
a V turn is held from its producer's end until its consumer starts. Frees at the same
instant as an allocation count first, so back-to-back ops do not add up. Units: seconds
and bytes.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.ir import B, F, OPS, R, W

from .costs import StageCost


def resident_bytes(graph: TaskGraph, stage_costs: list[StageCost]) -> list[float]:
    """Parameter bytes each rank holds: one copy per virtual stage placed on it."""
    held = [0.0] * graph.schedule.ranks
    for st in graph.schedule.stages:
        held[st.rank] += stage_costs[st.model_stage].param_bytes
    return held


class Buffers(NamedTuple):
    """Communication and hand-over buffers: buffer i holds nbytes[i] bytes on rank[i]
    from start[i] to end[i] (seconds)."""

    rank: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray


def buffer_intervals(graph: TaskGraph, edge_bytes: np.ndarray, posts: np.ndarray, unit_start: np.ndarray,
                     unit_end: np.ndarray, edge_end: np.ndarray) -> Buffers:
    """Every communication and hand-over buffer, edge by edge (a transfer's sender side,
    then its receiver side); `posts`: per edge, the receiver's unit its receive is
    posted before (`simulator.posting`)."""
    col = graph.columns()
    unit_start, unit_end, edge_end = np.asarray(unit_start), np.asarray(unit_end), np.asarray(edge_end)
    edges = np.flatnonzero(np.asarray(edge_bytes) != 0)
    producer, consumer = col["unit"][col["edge_src"][edges]], col["unit"][col["edge_dst"][edges]]
    src_rank, dst_rank = col["rank"][col["edge_src"][edges]], col["rank"][col["edge_dst"][edges]]
    nbytes = np.asarray(edge_bytes, dtype=float)[edges]
    xfer = col["edge_kind"][edges] != LOCAL
    held_to = np.where(xfer, edge_end[edges], unit_start[consumer])  # a hand-over until its consumer starts
    first = np.asarray([ids[0] if ids else 0 for ids in graph.rank_units], dtype=np.int64)
    at = np.asarray(posts)[edges[xfer]]
    # posted after the unit before position `at` (units of a rank are consecutive ids), or at the start
    posted = np.where(at > 0, unit_end[first[dst_rank[xfer]] + at - 1], 0.0)
    recv_start = np.minimum(posted, unit_start[consumer[xfer]])
    # edge by edge, the sender's side then (for a transfer) the receiver's: places, not a sort
    sent_at = np.arange(len(edges)) + (np.cumsum(xfer) - xfer)
    received_at = sent_at[xfer] + 1

    def both(sent, received):
        out = np.empty(len(sent) + len(received), dtype=np.result_type(sent, received))
        out[sent_at], out[received_at] = sent, received
        return out

    return Buffers(both(src_rank, dst_rank[xfer]), both(unit_end[producer], recv_start),
                   both(held_to, unit_start[consumer[xfer]]), both(nbytes, nbytes[xfer]))


def recompute_kept(stage_costs: list[StageCost]) -> list[float]:
    """Bytes an F of each model stage keeps until its R when the stage recomputes:
    `recompute_memory`, or by default the stage input (the previous model stage's
    activation_bytes; 0 for the first model stage, whose input is the data)."""
    return [c.recompute_memory if c.recompute_memory is not None
            else (stage_costs[k - 1].activation_bytes if k > 0 else 0.0)
            for k, c in enumerate(stage_costs)]


def memory_samples(graph: TaskGraph, stage_costs: list[StageCost], task_start: np.ndarray,
                   task_end: np.ndarray, buffers: Buffers | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank, (times, bytes) after every change, starting with the resident bytes at t=0.
    `buffers`: extra holdings (see `buffer_intervals`)."""
    sched = graph.schedule
    col = graph.columns()
    model = np.asarray([st.model_stage for st in sched.stages], dtype=np.int64)[col["stage"]]
    act = np.asarray([c.activation_memory for c in stage_costs], dtype=float)[model]
    keep = np.asarray([c.weight_memory for c in stage_costs], dtype=float)[model]
    op = col["op"]
    is_f, is_r = op == OPS.index(F), op == OPS.index(R)
    if is_r.any():  # an F whose (microbatch, virtual stage) has an R keeps only `kept` until the R
        kept = np.asarray(recompute_kept(stage_costs), dtype=float)[model]
        cell = col["mb"].astype(np.int64) * len(sched.stages) + col["stage"]
        light = is_f & np.isin(cell, cell[is_r])
        first, rest = np.where(light, kept, act), act - kept
    else:
        first, rest = act, 0.0
    delta = np.select([is_f, is_r, op == OPS.index(B), op == OPS.index(W)], [first, rest, -(act - keep), -keep], -act)
    allocates = is_f | is_r
    when = np.where(allocates, np.asarray(task_start, dtype=float), np.asarray(task_end, dtype=float))
    rank, kind = col["rank"], allocates.astype(np.int8)  # kind 1: an allocation, after frees at the same time
    if buffers is not None and len(buffers.rank):
        n = len(buffers.rank)
        b_rank, b_when = np.repeat(buffers.rank, 2), np.empty(2 * n)
        b_when[0::2], b_when[1::2] = buffers.start, buffers.end
        b_delta = np.empty(2 * n)
        b_delta[0::2], b_delta[1::2] = buffers.nbytes, -buffers.nbytes
        b_kind = np.tile(np.array([1, 0], dtype=np.int8), n)
        rank, when = np.concatenate((b_rank, rank)), np.concatenate((b_when, when))
        kind, delta = np.concatenate((b_kind, kind)), np.concatenate((b_delta, delta))
    changes = np.flatnonzero(delta != 0)
    # by rank, time, kind (frees first), then event order: stable sorts by (rank, kind), then
    # by time within each rank's share, where events come in runs already in time order (a
    # rank's ops in program order), which the stable sort merges rather than sorts
    group = rank[changes].astype(np.int16 if sched.ranks < 2 ** 14 else np.int64) * 2 + kind[changes]
    by_group = np.argsort(group, kind="stable")
    order = changes[by_group]
    bounds = np.searchsorted(group[by_group], 2 * np.arange(sched.ranks + 1))
    by_time = when[order]
    for r in range(sched.ranks):
        a, b = bounds[r], bounds[r + 1]
        order[a:b] = order[a:b][np.argsort(by_time[a:b], kind="stable")]
    base = resident_bytes(graph, stage_costs)
    out = []
    for r in range(sched.ranks):
        mine = order[bounds[r]:bounds[r + 1]]
        if len(mine):
            times = np.concatenate(([min(0.0, when[mine[0]])], when[mine]))
            levels = base[r] + np.concatenate(([0.0], np.cumsum(delta[mine])))
        else:
            times, levels = np.array([0.0]), np.array([base[r]])
        out.append((times, levels))
    return out


def peak_bytes(samples: tuple[np.ndarray, np.ndarray]) -> float:
    return float(samples[1].max()) if len(samples[1]) else 0.0
