"""Timing the sum of shared gradients end to end, as the runtime runs it.

DualPipe ends every step with the sum of its two copies' gradients
(`executor.replicas.sum_shared_grads`): flattening the gradients, one message each
way over the default process group, adding, copying the sum back into every `.grad`.
Ping-pong times only the messages, over the pipeline's own link groups; the copies
around them are several times the bytes. Here two ranks run `sum_shared_grads` itself
on parameters shaped like the model's largest stage (once and twice its parameters,
as one and two model stages are summed, and one small tensor), both starting at a
barrier; a repeat takes the later rank's seconds. `fit_gradient_sum` fits
seconds = fixed + bytes * per_byte to the medians (least squares).
Units: seconds and bytes.
"""
from __future__ import annotations

import statistics
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .clock import now
from .replicas import SharedGroup, sum_shared_grads, trainable

SUM_PAIR = (0, 1)            # the ranks that time the sum
SUM_SMALL_BYTES = 1 << 12    # the small payload: the sum's fixed cost
SUM_MAX_BYTES = 64 << 20     # the largest payload; a bigger stage is timed at this many bytes (flat)
SUM_REPEATS, SUM_WARMUP = 5, 1


def stage_shapes(stages: Sequence[nn.Module]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each trainable parameter of the stage with the most parameter
    bytes (the same on every rank: every rank builds the whole model)."""
    def nbytes(stage: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in trainable(stage))

    biggest = max(stages, key=nbytes)
    return [(tuple(p.shape), p.dtype) for p in trainable(biggest)]


def payloads(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> list[list[tuple[tuple[int, ...], torch.dtype]]]:
    """The parameter shapes of each timed payload: one small tensor, the stage's
    parameters once and twice (one flat float32 tensor of up to SUM_MAX_BYTES instead,
    for a stage whose twice would be more)."""
    def size(ps) -> int:
        return sum(int(np.prod(s)) * torch.empty((), dtype=d).element_size() for s, d in ps)

    small = [((SUM_SMALL_BYTES // 4,), torch.float32)]
    if not shapes or size(shapes) == 0:
        return [small]
    if 2 * size(shapes) > SUM_MAX_BYTES:
        return [small, [((SUM_MAX_BYTES // 8,), torch.float32)], [((SUM_MAX_BYTES // 4,), torch.float32)]]
    return [small, shapes, shapes * 2]


def time_gradient_sum(rank: int, world: int, shapes: list[tuple[tuple[int, ...], torch.dtype]],
                      device: torch.device, timeout: float, repeats: int = SUM_REPEATS,
                      warmup: int = SUM_WARMUP) -> dict[int, list[float]]:
    """Collective over every rank of the default group: the ranks of SUM_PAIR run
    `sum_shared_grads` on each payload (`payloads`) `warmup + repeats` times, every
    call after a barrier. Returns {bytes: seconds per measured repeat} of this rank's
    calls ({} on other ranks, or with one rank)."""
    if world < 2:
        return {}
    out: dict[int, list[float]] = {}
    for shapes_ in payloads(shapes):
        module = nn.Module()
        module.params = nn.ParameterList(nn.Parameter(torch.zeros(s, dtype=d, device=device)) for s, d in shapes_)
        ps = trainable(module)
        for p in ps:
            p.grad = torch.ones_like(p)
        nbytes = sum(p.numel() * p.element_size() for p in ps)
        summed = SharedGroup(SUM_PAIR, tuple((0, i) for i in range(len(ps))))
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            start = now()
            if rank in SUM_PAIR:
                sum_shared_grads(rank, [summed], [module], 0, timeout, device)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            if i >= warmup:
                times.append(now() - start)
        if rank in SUM_PAIR:
            out[nbytes] = times
        del module, ps
    dist.barrier()
    return out


def pair_medians(reports: Sequence[dict[int, list[float]]]) -> dict[int, float]:
    """Per payload bytes, the median over repeats of the later rank's seconds (`reports`:
    `time_gradient_sum`'s result of each rank of SUM_PAIR)."""
    sizes = sorted(set().union(*(r.keys() for r in reports))) if reports else []
    return {n: statistics.median(max(ts) for ts in zip(*(r[n] for r in reports))) for n in sizes}


def fit_gradient_sum(medians: dict[int, float]) -> tuple[float, float] | None:
    """(fixed seconds, seconds per byte) of the least-squares line through the points
    (bytes -> seconds) with both at least 0: where the free line falls, the mean as a
    fixed cost; where it crosses 0 s above 0 bytes, the best line through the origin.
    None with fewer than two sizes."""
    if len(medians) < 2:
        return None
    sizes = np.asarray(list(medians), float)
    seconds = np.asarray(list(medians.values()), float)
    slope, intercept = np.polyfit(sizes, seconds, 1)
    if slope <= 0:
        return float(seconds.mean()), 0.0
    if intercept < 0:
        return 0.0, float(sizes @ seconds / (sizes @ sizes))
    return float(intercept), float(slope)
