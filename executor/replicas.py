"""Replicas: a model stage held by several ranks (DualPipe) ends the step with the sum of
their gradients on every holder.

The lowest holder leads: the others send it their flattened gradients, it adds them in
rank order and sends the sum back, so every holder ends with the same bits. All sends to
leaders are posted before anyone waits, so the exchange cannot deadlock.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from pipesched.schedules.ir import Schedule

from .comm import ExecutorError


def holders(schedule: Schedule) -> dict[int, list[int]]:
    """Model stage -> the ranks holding a copy of it, ascending."""
    out: dict[int, set[int]] = {}
    for st in schedule.stages:
        out.setdefault(st.model_stage, set()).add(st.rank)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def sum_replica_grads(rank: int, schedule: Schedule, params_of: dict[int, list[torch.nn.Parameter]],
                      tag_base: int, timeout: float, device: torch.device) -> None:
    """Sum the gradients of every replicated model stage this rank holds (collective
    among the holders). `params_of[model_stage]`: this rank's parameters of it; tags
    from `tag_base` up are free (above every edge id)."""
    shared = {k: ranks for k, ranks in holders(schedule).items() if len(ranks) > 1 and rank in ranks}
    if not shared:
        return
    stage = "cpu" if device.type == "cpu" or dist.get_backend() == "gloo" else device
    wait = timedelta(seconds=timeout)
    pending = []  # every handle is kept until it completes

    def finish(work, peer: int, k: int, what: str) -> None:
        try:
            work.wait(wait)
        except RuntimeError as exc:
            raise ExecutorError(f"rank {rank}: {what} replica gradients of model stage {k} with rank {peer} "
                                f"failed: {str(exc).splitlines()[0]}") from None

    mine = {k: _flat(params_of[k]).to(stage) for k in shared}
    for k, ranks in shared.items():
        if rank != ranks[0]:
            pending.append((dist.isend(mine[k], ranks[0], tag=tag_base + 2 * k), ranks[0], k))
    for k, ranks in shared.items():
        if rank != ranks[0]:
            continue
        total = mine[k].clone()
        for peer in ranks[1:]:
            theirs = torch.empty_like(total)
            finish(dist.irecv(theirs, peer, tag=tag_base + 2 * k), peer, k, "receiving")
            total += theirs
        mine[k] = total
        pending.extend((dist.isend(total, peer, tag=tag_base + 2 * k + 1), peer, k) for peer in ranks[1:])
    for k, ranks in shared.items():
        if rank != ranks[0]:
            finish(dist.irecv(mine[k], ranks[0], tag=tag_base + 2 * k + 1), ranks[0], k, "receiving summed")
    for work, peer, k in pending:
        finish(work, peer, k, "sending")
    for k in shared:
        offset = 0
        for p in params_of[k]:
            n = p.numel()
            p.grad = mine[k][offset:offset + n].view_as(p).to(p.device).clone()
            offset += n
