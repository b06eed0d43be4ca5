"""Data parallelism in the executor: d replicas of the pipeline, p x d processes.

Global rank g runs pipeline rank g % p of replica g // p. Each replica's pipeline
transfers stay inside it (its own link groups); the ranks at the same pipeline position
form a DP group. The global batch is d x m microbatches (m: the schedule's); replica q
runs microbatches q*m .. q*m + m - 1 with the global batch's loss scale, so the sum of
the replicas' gradients is the whole batch's.

During a step, as soon as a model stage's last W or BW on a rank ends, its gradients
are all-reduced (sum) over the DP group, in buckets of at most `bucket_bytes`, by one
thread per rank (the DP lane: one all-reduce at a time, in the order the stages became
ready; every rank of a DP group runs the same program, so the orders match). After the
rank's program and its all-reduces, each model stage takes an SGD step, in the order
its all-reduces finished. The learning rate defaults to 0: the update does all of its
arithmetic but leaves the weights as initialised, so every measured step does the same
work and the gradients can be checked against the unpipelined reference.
"""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import BW, W

from .clock import now
from .comm import ExecutorError
from .models import PipelineModel
from .placement import loops_off_own_cores


@dataclass(frozen=True)
class Layout:
    """Where global rank `rank` sits among p x d: pipeline rank and replica."""

    rank: int       # global
    ranks: int      # p, pipeline ranks per replica
    replicas: int   # d

    @property
    def pipeline_rank(self) -> int:
        return self.rank % self.ranks

    @property
    def replica(self) -> int:
        return self.rank // self.ranks

    @property
    def offset(self) -> int:
        """Global rank of this replica's pipeline rank 0."""
        return self.replica * self.ranks


def replica_model(model: PipelineModel, replica: int, replicas: int) -> PipelineModel:
    """Replica `replica`'s share of a model built for the global batch: its microbatches,
    the global batch's loss scale (same modules)."""
    m = len(model.inputs) // replicas
    lo = replica * m
    return PipelineModel(model.stages, model.loss_fn, model.inputs[lo:lo + m], model.targets[lo:lo + m],
                         model.scale, model.name)


def last_weight_tasks(graph: TaskGraph, rank: int) -> dict[int, int]:
    """Model stage -> the task id of its last W or BW in `rank`'s program: when it ends,
    the stage's gradients are final and its all-reduce starts."""
    return {graph.schedule.stages[graph.tasks[t].stage].model_stage: t  # later ones overwrite: the last
            for u in graph.rank_units[rank] for t in graph.units[u] if graph.tasks[t].op in (W, BW)}


def dp_groups(ranks: int, replicas: int) -> list:
    """One process group per pipeline position: the ranks r, r + p, r + 2p, ... Collective:
    every rank creates every group, in the same order. Their event loops run off the
    rank's own cores (`placement.loops_off_own_cores`)."""
    with loops_off_own_cores():
        return [dist.new_group([q * ranks + r for q in range(replicas)]) for r in range(ranks)]


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def buckets(params: list[nn.Parameter], bucket_bytes: float | None) -> list[list[nn.Parameter]]:
    """Consecutive parameters in groups of at most `bucket_bytes` (a larger parameter alone)."""
    out: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        n = p.numel() * p.element_size()
        if out and bucket_bytes is not None and size + n <= bucket_bytes:
            out[-1].append(p)
            size += n
        elif not out or bucket_bytes is not None:
            out.append([p])
            size = n
        else:
            out[-1].append(p)
    return out


def sgd_step(params: list[nn.Parameter], lr: float) -> None:
    """p -= lr * p.grad for every parameter (all with gradients), finished on the device."""
    with torch.no_grad():
        torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)
    if params and params[0].device.type == "cuda":
        torch.cuda.synchronize(params[0].device)


def allreduce_bucket(grads: list[torch.Tensor], group, timeout: float, flat: torch.Tensor | None = None) -> None:
    """Sum one bucket of gradients over `group`, in place: flattened into one buffer (on
    the host for gloo), all-reduced, copied back. The copies cost about as much as the
    all-reduce itself on a CPU host, so calibration times this function, not the bare
    all-reduce. `flat`: the bucket's buffer (as many elements as the gradients, their
    dtype and device), kept from step to step as DDP keeps its buckets (`bucket_buffer`);
    without it a new one is made."""
    parts = [g.reshape(-1) for g in grads]
    if flat is None:
        flat = torch.cat(parts)
    elif flat.numel() != (n := sum(g.numel() for g in parts)):
        raise ValueError(f"the bucket's buffer holds {flat.numel()} elements, its gradients {n}")
    else:
        torch.cat(parts, out=flat)
    staged = flat.device.type == "cuda" and dist.get_backend(group) == "gloo"
    buf = flat.cpu() if staged else flat
    dist.all_reduce(buf, group=group, async_op=True).wait(timedelta(seconds=timeout))
    if staged:
        flat.copy_(buf)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
    if flat.device.type == "cuda":
        torch.cuda.synchronize(flat.device)


def bucket_buffer(grads: list[torch.Tensor]) -> torch.Tensor:
    """A buffer for one bucket of `grads` (`allreduce_bucket`), made once and kept. A new
    buffer of megabytes every step is memory the allocator returns to the OS and maps
    again page by page, so the all-reduce's time then depends on what the step before did
    and steps spread widely (measurements: docs/data_parallel.md)."""
    return torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)


class GradientSync:
    """A rank's DP lane: all-reduces of its model stages' gradients and their SGD steps.
    Spans (seconds on the host clock): `allreduce` (model stage, bucket, start, end) and
    `optimizer` (model stage, start, end)."""

    def __init__(self, rank: int, modules: dict[int, nn.Module], group, bucket_bytes: float | None,
                 timeout: float, lr: float = 0.0):
        self.rank, self.modules, self.group = rank, modules, group
        self.bucket_bytes, self.timeout, self.lr = bucket_bytes, timeout, lr
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rank{rank}-dp")
        self.pending: list[tuple[int, cf.Future]] = []
        self.allreduce: list[tuple[int, int, float, float]] = []
        self.optimizer: list[tuple[int, float, float]] = []
        self.flat: dict[tuple[int, int], torch.Tensor] = {}  # (model stage, bucket) -> its buffer

    def start(self, model_stage: int) -> None:
        """All-reduce the stage's gradients on the DP lane (returns at once)."""
        self.pending.append((model_stage, self.pool.submit(self._allreduce, model_stage)))

    def _allreduce(self, k: int) -> float:
        params = [p for p in trainable(self.modules[k])]
        for p in params:
            if p.grad is None:  # unused here: its gradient is zero, and every replica sends one
                p.grad = torch.zeros_like(p)
        for i, bucket in enumerate(buckets(params, self.bucket_bytes)):
            start = now()
            grads = [p.grad for p in bucket]
            if (k, i) not in self.flat:  # the first step's (a warm-up step's, in runs)
                self.flat[(k, i)] = bucket_buffer(grads)
            allreduce_bucket(grads, self.group, self.timeout, self.flat[(k, i)])
            self.allreduce.append((k, i, start, now()))
        return now()

    def finish(self) -> list[int]:
        """Wait for every all-reduce of the step; the model stages in the order they finished."""
        done = []
        for k, future in self.pending:
            try:
                done.append((future.result(timeout=self.timeout), k))
            except cf.TimeoutError:
                raise ExecutorError(f"rank {self.rank}: timed out after {self.timeout:g} s all-reducing the "
                                    f"gradients of model stage {k}") from None
            except RuntimeError as exc:
                raise ExecutorError(f"rank {self.rank}: the all-reduce of model stage {k}'s gradients failed: "
                                    f"{str(exc).splitlines()[0]}") from None
        self.pending = []
        return [k for _, k in sorted(done)]

    def step(self, order: list[int]) -> None:
        """SGD on each model stage in `order` (p -= lr * grad)."""
        for k in order:
            start = now()
            sgd_step(trainable(self.modules[k]), self.lr)
            self.optimizer.append((k, start, now()))

    def take_spans(self) -> tuple[list, list]:
        spans = (self.allreduce, self.optimizer)
        self.allreduce, self.optimizer = [], []
        return spans

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
