"""Measuring the links between two ranks and what posting a transfer costs the host.

`pingpong`: one-way time per message size (median round trip / 2) over the process
group, isend/irecv and waits as the runtime uses them; `fit_link` turns the points
into latency + bytes / bandwidth. The one-way time includes the sender's posting of the
isend; that is subtracted, because the simulator charges posting to the sending rank.

`posting_costs`: the host time of posting one send and one receive, and of taking an
arrived receive, through the runtime's own transport, each right after the rank ran one
of its ops, as in a step (on a GPU once the op's kernels have finished, or the host copy
would wait for them and count the op as posting).
The op leaves the caches full of its tensors, which makes posting several times slower
than on an idle rank (docs/executor.md has the measurements).
Units: seconds and bytes.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from pipesched.schedules.ir import F, Task

from .clock import now
from .comm import GlooTransport, NcclTransport, Transfer
from .launch import RankContext
from .memory import MemoryLedger
from .models import TensorSpec


def pingpong(ctx: RankContext, pair: tuple[int, int], sizes: list[int], repeats: int,
             warmup: int, groups: dict | None = None) -> tuple[list[float], float]:
    """(one-way seconds per size, median seconds the sender's isend call took) between
    the ranks of `pair`, over the runtime's process group of each direction (`groups`,
    see `executor.comm.link_groups`); other ranks return ([], 0)."""
    a, b = pair
    if ctx.rank not in pair:
        return [], 0.0
    peer = b if ctx.rank == a else a
    groups = groups or {}
    out_group, in_group = groups.get((ctx.rank, peer)), groups.get((peer, ctx.rank))
    staged = ctx.backend == "gloo-cuda"
    device = torch.device("cpu") if ctx.backend in ("gloo", "gloo-cuda") else ctx.device
    wait = timedelta(seconds=ctx.timeout)
    out, posting = [], []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        src = torch.zeros_like(buf, device=ctx.device) if staged else buf
        trips = []
        # every receive is posted before the other side sends, as the runtime posts them:
        # `a` posts the reply's receive before it sends; `b` the next round's before replying
        buffers = [buf, torch.zeros_like(buf)]
        incoming = dist.irecv(buffers[0], peer, tag=0, group=in_group) if ctx.rank == b else None
        for i in range(warmup + repeats):
            start = now()
            if ctx.rank == a:
                incoming = dist.irecv(buffers[1], peer, tag=i, group=in_group)
                work = dist.isend(src.to("cpu") if staged else src, peer, tag=i, group=out_group)
                posted = now() - start
                work.wait(wait)
                incoming.wait(wait)
            else:
                incoming.wait(wait)
                got = buffers[i % 2]
                if i + 1 < warmup + repeats:
                    incoming = dist.irecv(buffers[(i + 1) % 2], peer, tag=i + 1, group=in_group)
                if staged:
                    got = got.to(ctx.device)
                dist.isend(got.to("cpu") if staged else got, peer, tag=i, group=out_group).wait(wait)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            if i >= warmup:
                trips.append(now() - start)
                if ctx.rank == a:
                    posting.append(posted)
        out.append(statistics.median(trips) / 2)
    return out, statistics.median(posting) if posting else 0.0


def fit_link(sizes: list[int], one_way: list[float]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of the least-squares line through the points; a
    flat or falling line means no measurable bandwidth limit (infinite)."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(one_way, float), 1)
    latency = max(0.0, float(intercept))
    bandwidth = float("inf") if slope <= 0 else 1.0 / float(slope)
    return latency, bandwidth


@dataclass
class PostingCosts:
    """Host seconds of the runtime's transfer handling, each right after an op."""

    send: float = 0.0     # posting a send
    leave: float = 0.0    # from starting to post a send until its data can leave
    recv: float = 0.0     # posting a receive
    take: float = 0.0     # taking an arrived receive for its op


def posting_costs(ctx: RankContext, pair: tuple[int, int], spec: TensorSpec, run_op: Callable[[], None],
                  repeats: int, warmup: int, groups: dict | None = None) -> PostingCosts:
    """The host time of posting one send and one receive, and of taking an arrived
    receive, through the runtime's transport, each right after `run_op()` (one of the
    rank's own ops); the lower rank of `pair` sends, the higher receives (its send
    fields stay 0, the sender's receive fields too). Other ranks return zeros."""
    costs = PostingCosts()
    if ctx.rank not in pair:
        return costs
    sender, receiver = pair
    transport_cls = NcclTransport if ctx.backend == "nccl" else GlooTransport
    transport = transport_cls(ctx.rank, ctx.timeout, MemoryLedger(now), ctx.device, 1, groups)
    payload = torch.zeros(spec.shape, dtype=spec.dtype, device=ctx.device)

    def finish_op() -> None:
        # a GPU op is still running when run_op returns; copying a tensor to or from the
        # host would wait for it, counting the op's time as posting time
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    arrived = torch.zeros(1)
    samples: dict[str, list[float]] = {"send": [], "leave": [], "recv": [], "take": []}
    try:
        for i in range(warmup + repeats):
            dummy = Task(F, i, 0)
            transfer = Transfer(i, receiver if ctx.rank == sender else sender, dummy, dummy, "activation")
            measured = i >= warmup
            run_op()
            finish_op()
            start = now()
            if ctx.rank == sender:
                handed_over = transport.handed_over
                transport.send_all([(transfer, payload)])
                took = now() - start
                transport.drain()
                dist.send(arrived, receiver)  # after the payload: it has arrived when this has
                if measured:
                    samples["send"].append(took)
                    samples["leave"].append(transport.handed_over - handed_over)
            else:
                transport.post_recvs([(transfer, spec)])
                posted = now() - start
                dist.recv(arrived, sender)
                run_op()
                finish_op()
                start = now()
                transport.take(transfer)
                if measured:
                    samples["recv"].append(posted)
                    samples["take"].append(now() - start)
    finally:
        transport.close()
    for name, values in samples.items():
        setattr(costs, name, statistics.median(values) if values else 0.0)
    return costs
