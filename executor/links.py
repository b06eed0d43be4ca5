"""Measuring the links between two ranks and what posting a transfer costs the host.

`pingpong`: one-way time per message size (median round trip / 2) over the process
group, isend/irecv and waits as the runtime uses them; `fit_link` turns the points
into latency + bytes / bandwidth. The one-way time includes the sender's posting of the
isend; that is subtracted, because the simulator charges posting to the sending rank.

`posting_costs`: the host time of posting one send and one receive through the
runtime's own transport, each right after the rank ran one of its ops, as in a step.
The op leaves the caches full of its tensors, which makes posting several times slower
than on an idle rank (measured here: 170 us instead of 35 us for a gloo isend).
Units: seconds and bytes.
"""
from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from schedules.ir import F, Task

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
        for i in range(warmup + repeats):
            start = now()
            if ctx.rank == a:
                work = dist.isend(src.to("cpu") if staged else src, peer, tag=i, group=out_group)
                posted = now() - start
                work.wait(wait)
                dist.irecv(buf, peer, tag=i, group=in_group).wait(wait)
            else:
                dist.irecv(buf, peer, tag=i, group=in_group).wait(wait)
                if staged:
                    buf.to(ctx.device)
                dist.isend(src.to("cpu") if staged else buf, peer, tag=i, group=out_group).wait(wait)
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


def posting_costs(ctx: RankContext, pair: tuple[int, int], spec: TensorSpec, run_op: Callable[[], None],
                  repeats: int, warmup: int, groups: dict | None = None) -> tuple[float, float, float]:
    """(seconds to post a send, to post a receive, from starting to post a send until
    its data can leave) through the runtime's transport, each right after `run_op()` (one
    of the rank's own ops); the lower rank of `pair` sends, the higher receives. Other
    ranks return zeros; the sender's receive time and the receiver's send times are 0."""
    if ctx.rank not in pair:
        return 0.0, 0.0, 0.0
    sender, receiver = pair
    transport_cls = NcclTransport if ctx.backend == "nccl" else GlooTransport
    transport = transport_cls(ctx.rank, ctx.timeout, MemoryLedger(now), ctx.device, 1, groups)
    payload = torch.zeros(spec.shape, dtype=spec.dtype, device=ctx.device)
    send_times, recv_times, leave_times = [], [], []
    try:
        for i in range(warmup + repeats):
            dummy = Task(F, i, 0)
            transfer = Transfer(i, receiver if ctx.rank == sender else sender, dummy, dummy, "activation")
            run_op()
            start = now()
            if ctx.rank == sender:
                handed_over = transport.handed_over
                transport.send_all([(transfer, payload)])
                if i >= warmup:
                    send_times.append(now() - start)
                    leave_times.append(transport.handed_over - handed_over)
                transport.drain()
            else:
                transport.post_recvs([(transfer, spec)])
                (recv_times if i >= warmup else []).append(now() - start)
                transport.take(transfer)
    finally:
        transport.close()
    def median(xs: list[float]) -> float:
        return statistics.median(xs) if xs else 0.0

    return median(send_times), median(recv_times), median(leave_times)
