"""Parameters held by several ranks end the step with the sum of their gradients on
every holder.

Two things put a parameter on several ranks: a model stage held by several ranks
(DualPipe's replicas), and one Parameter used by several model stages (tied input and
output embeddings, on the first and the last stage). `shared_groups` finds both from
the stage modules themselves: a parameter is identified by its object (every rank
unpickles the whole model, so the tie survives), its holders are the ranks holding any
model stage that uses it, and parameters with the same holders travel together. On one
rank a tied parameter is one object, so both of its uses already added into one `.grad`
and it is sent once.

The lowest holder leads: the others send it their flattened gradients, it adds them in
rank order and sends the sum back, so every holder ends with the same bits. All sends to
leaders are posted before anyone waits, so the exchange cannot deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from pipesched.schedules.ir import Schedule

from .comm import ExecutorError


def holders(schedule: Schedule) -> dict[int, list[int]]:
    """Model stage -> the ranks holding a copy of it, ascending."""
    out: dict[int, set[int]] = {}
    for st in schedule.stages:
        out.setdefault(st.model_stage, set()).add(st.rank)
    return {k: sorted(v) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class SharedGroup:
    """Parameters whose gradients `ranks` sum; each named by its first use, (model
    stage, index among that stage's trainable parameters)."""

    ranks: tuple[int, ...]
    params: tuple[tuple[int, int], ...]


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def shared_groups(stage_holders: dict[int, Sequence[int]], stages: Sequence[nn.Module]) -> list[SharedGroup]:
    """Every parameter of `stages` held by more than one rank (`stage_holders[k]`: the
    ranks holding model stage k), grouped by holders; the same on every rank."""
    first: dict[int, tuple[int, int]] = {}
    ranks_of: dict[tuple[int, int], set[int]] = {}
    for k, stage in enumerate(stages):
        for i, p in enumerate(trainable(stage)):
            name = first.setdefault(id(p), (k, i))
            ranks_of.setdefault(name, set()).update(stage_holders.get(k, ()))
    by_ranks: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for name, ranks in ranks_of.items():
        if len(ranks) > 1:
            by_ranks.setdefault(tuple(sorted(ranks)), []).append(name)
    return [SharedGroup(ranks, tuple(names)) for ranks, names in sorted(by_ranks.items())]


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def sum_shared_grads(rank: int, groups: list[SharedGroup], stages: Sequence[nn.Module], tag_base: int,
                     timeout: float, device: torch.device, offset: int = 0) -> None:
    """Sum the gradients of every group this rank belongs to (collective among each
    group's ranks). `stages`: this rank's copy of every model stage; tags from
    `tag_base` up are free (above every edge id). Ranks are pipeline ranks, the process
    group's rank `offset` higher (data parallelism: the replica's first rank)."""
    mine_groups = [(g, group) for g, group in enumerate(groups) if rank in group.ranks]
    if not mine_groups:
        return
    stage = "cpu" if device.type == "cpu" or dist.get_backend() == "gloo" else device
    wait = timedelta(seconds=timeout)
    pending = []  # every handle is kept until it completes
    params = {}
    for g, group in mine_groups:
        by_stage = {k: trainable(stages[k]) for k in {k for k, _ in group.params}}
        params[g] = [by_stage[k][i] for k, i in group.params]

    def finish(work, peer: int, g: int, what: str) -> None:
        try:
            work.wait(wait)
        except RuntimeError as exc:
            where = ", ".join(sorted({f"model stage {k}" for k, _ in groups[g].params}))
            raise ExecutorError(f"rank {rank}: {what} shared gradients ({where}) with rank {peer} "
                                f"failed: {str(exc).splitlines()[0]}") from None

    mine = {g: _flat(params[g]).to(stage) for g, _ in mine_groups}
    for g, group in mine_groups:
        if rank != group.ranks[0]:
            pending.append((dist.isend(mine[g], offset + group.ranks[0], tag=tag_base + 2 * g), group.ranks[0], g))
    for g, group in mine_groups:
        if rank != group.ranks[0]:
            continue
        total = mine[g].clone()
        for peer in group.ranks[1:]:
            theirs = torch.empty_like(total)
            finish(dist.irecv(theirs, offset + peer, tag=tag_base + 2 * g), peer, g, "receiving")
            total += theirs
        mine[g] = total
        pending.extend((dist.isend(total, offset + peer, tag=tag_base + 2 * g + 1), peer, g) for peer in group.ranks[1:])
    for g, group in mine_groups:
        if rank != group.ranks[0]:
            finish(dist.irecv(mine[g], offset + group.ranks[0], tag=tag_base + 2 * g + 1), group.ranks[0], g,
                   "receiving summed")
    for work, peer, g in pending:
        finish(work, peer, g, "sending")
    for g, _ in mine_groups:
        offset = 0
        for p in params[g]:
            n = p.numel()
            p.grad = mine[g][offset:offset + n].view_as(p).to(p.device).clone()
            offset += n
