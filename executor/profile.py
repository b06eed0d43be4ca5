"""Profiling one stage module: how long its F, B, W and BW take, what they hold, and how
much slower they run next to other ranks.

The ops are called exactly as the runtime calls them (`StageModule`), one at a time,
on the rank's own device and threads. Units: seconds and bytes.
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from .clock import CpuTimer, CudaTimer, now
from .memory import MemoryLedger
from .models import PipelineModel, TensorSpec
from .stage import StageModule, held_bytes

# One repetition, in two sequences that each start with no parameter gradients (as a
# step does): the first W of a step, then steady ones that add into the gradients, and
# a steady BW; then the first BW of a step.
PLAN = (("F", "B", "W first", "F", "B", "W", "F", "BW"), ("F", "BW first"))
OPS_PER_REPETITION = sum(len(s) for s in PLAN)


@dataclass
class StageProfile:
    """One model stage profiled on one rank (seconds, bytes)."""

    model_stage: int
    rank: int
    forward: float
    backward_input: float
    backward_weight: float           # steady: adding into existing gradients
    backward_full: float             # steady
    activation_memory: float         # held from F to its backward
    weight_memory: float             # held from a split B to its W
    param_bytes: float
    grad_accumulate: float = 0.0     # what a steady W/BW costs more than the first of a step
    bookkeeping: float = 0.0         # the runtime's host time between two ops (median gap)
    samples: dict[str, list[float]] = field(default_factory=dict)

    def op_seconds(self) -> float:
        """The time of one F, B, W and BW together: a weight for comparisons."""
        return self.forward + self.backward_input + self.backward_weight + self.backward_full


def _timer(device: torch.device):
    return CudaTimer(device) if device.type == "cuda" else CpuTimer()


def profile_stage(sm: StageModule, x: torch.Tensor, target: torch.Tensor | None, grad: torch.Tensor | None,
                  device: torch.device, repeats: int, warmup: int, rank: int = 0,
                  before_op: Callable[[], None] | None = None) -> StageProfile:
    """Time every op of `sm` over `warmup + repeats` repetitions of PLAN (medians of the
    measured ones). `before_op` runs before each op (a barrier, to run in lockstep with
    other ranks); the gap between one op's end and the next op's start, which holds the
    runtime's own per-op bookkeeping (`held_bytes`), is reported as `bookkeeping`."""
    timer = _timer(device)
    samples: dict[str, list[float]] = {"F": [], "B": [], "W": [], "BW": [], "W first": [], "BW first": []}
    act, kept, gaps = [], [], []
    for i in range(warmup + repeats):
        measured = i >= warmup
        for sequence in PLAN:
            for p in sm.params:
                p.grad = None
            if isinstance(timer, CudaTimer):
                timer.start_step()
            state = held = None
            marks = []
            for op in sequence:
                if before_op is not None:
                    before_op()
                start = timer.mark()
                if op == "F":
                    state, _ = sm.forward(0, x.detach().clone(), target)
                elif op == "B":
                    _, held = sm.backward_input(state, grad)
                elif op.startswith("W"):
                    sm.backward_weight(held)
                else:
                    sm.backward_full(state, grad)
                end = timer.mark()
                # the same bookkeeping the runtime does after these ops
                if op == "F":
                    saved = held_bytes(state.boxes, [])
                    act += [saved] if measured else []
                elif op == "B":
                    needed = held_bytes(held.boxes, held.groups)
                    kept += [needed] if measured else []
                marks.append((op, start, end, now()))
            timer.sync()
            if measured:
                for op, start, end, _ in marks:
                    samples[op].append(timer.seconds(end) - timer.seconds(start))
                if before_op is None and isinstance(timer, CpuTimer):
                    gaps += [b[1] - a[2] for a, b in zip(marks, marks[1:])]
    for p in sm.params:
        p.grad = None
    med = {k: statistics.median(v) for k, v in samples.items()}
    accumulate = max(0.0, statistics.fmean((med["W"] - med["W first"], med["BW"] - med["BW first"])))
    param_bytes = sum(p.numel() * p.element_size() for p in sm.params)
    return StageProfile(sm.model_stage, rank, med["F"], med["B"], med["W"], med["BW"],
                        float(statistics.median(act)), float(statistics.median(kept)),
                        float(param_bytes), accumulate, statistics.median(gaps) if gaps else 0.0, samples)


def stage_for_profiling(model: PipelineModel, specs: list[TensorSpec], k: int, device: torch.device):
    """(StageModule, input, target, output gradient) to profile model stage k on `device`,
    with its own memory ledger (parameters excluded, as in the runtime)."""
    module = model.stages[k].to(device)
    sm = StageModule(module, k, len(model.stages), model.loss_fn, model.scale,
                     MemoryLedger(now, list(module.parameters())))
    gen = torch.Generator().manual_seed(1234 + k)
    last = k == len(model.stages) - 1
    if k == 0:
        x = model.inputs[0].to(device)
    else:
        x = torch.randn(specs[k - 1].shape, generator=gen, dtype=torch.float64).to(device, specs[k - 1].dtype)
    target = model.targets[0].to(device) if last else None
    grad = None if last else torch.randn(specs[k].shape, generator=gen, dtype=torch.float64).to(device, specs[k].dtype)
    return sm, x, target, grad


def switch_slowdown(sm: StageModule, x: torch.Tensor, target: torch.Tensor | None, grad: torch.Tensor | None,
                    repeats: int, warmup: int) -> tuple[float, float, float, float]:
    """(forward, backward, forward_second, backward_second): how much longer `sm`'s F takes
    right after the backward of a copy of the stage (the same shapes in other memory) than
    right after its own backward, and its fused backward right after the copy's F than
    right after another F of its own: a rank holding two stages alternates them so
    (DualPipe's F&B pairs: each F after the other stage's backward, each backward after
    the other stage's F); then the same for the F and the backward that follow those of
    `sm` once more (the copy's data still in the caches). As fractions, at least 0. CPU
    only: the two conditions alternate within each repetition, medians."""
    module = copy.deepcopy(sm.module)
    stages = sm.model_stage + (1 if sm.is_last else 2)  # so the copy is first or last as `sm` is
    other = StageModule(module, sm.model_stage, stages, sm.loss_fn, sm.loss_scale,
                        MemoryLedger(now, list(module.parameters())))
    taken: dict[bool, list[tuple[float, ...]]] = {False: [], True: []}

    def timed(op, *args):
        start = now()
        out = op(*args)
        return now() - start, out

    for i in range(warmup + repeats):
        for after_other in (False, True):
            before = other if after_other else sm
            state, _ = before.forward(0, x.detach().clone(), target)
            before.backward_full(state, grad)
            forward, (state, _) = timed(sm.forward, 0, x.detach().clone(), target)
            forward_second, (again, _) = timed(sm.forward, 2, x.detach().clone(), target)
            between, _ = before.forward(1, x.detach().clone(), target)  # another microbatch's F
            backward, _ = timed(sm.backward_full, state, grad)
            backward_second, _ = timed(sm.backward_full, again, grad)
            before.backward_full(between, grad)  # untimed: releases what it saved
            if i >= warmup:
                taken[after_other].append((forward, backward, forward_second, backward_second))
    for p in sm.params + other.params:
        p.grad = None

    def fraction(j: int) -> float:
        own = statistics.median(t[j] for t in taken[False])
        return max(0.0, statistics.median(t[j] for t in taken[True]) / own - 1.0) if own > 0 else 0.0

    return fraction(0), fraction(1), fraction(2), fraction(3)


def slowdown(alone: StageProfile, together: StageProfile) -> float:
    """How much longer the ops took next to other computing ranks (0.1 = 10 % longer)."""
    return together.op_seconds() / alone.op_seconds() - 1.0


def iteration_ends(sm: StageModule, x: torch.Tensor, target: torch.Tensor | None, grad: torch.Tensor | None,
                   iterations: int) -> list[float]:
    """Seconds from the start at which each of `iterations` back-to-back F + BW ends
    (a free-running load, to measure throughput when ranks share a core)."""
    ends = []
    start = now()
    for _ in range(iterations):
        state, _ = sm.forward(0, x.detach().clone(), target)
        sm.backward_full(state, grad)
        ends.append(now() - start)
    for p in sm.params:
        p.grad = None
    return ends


def seconds_per_iteration(ends: list[float], window: float) -> float:
    """The time per iteration of a free-running load over the first `window` seconds."""
    done = sum(1 for t in ends if t <= window)
    return window / max(1, done)
