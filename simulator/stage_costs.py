"""One stage's costs per microbatch (`StageCost`), and how stages merge and cut.

Units: seconds and bytes. The whole cost model (`simulator.costs.CostModel`) and the
layer-by-layer model (`simulator.layers.LayerCosts`) are built of these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

from pipesched.schedules.ir import B, BW, F, R, W
from pipesched.schedules.numbers import is_real


class CostError(ValueError):
    """A cost file or value is unusable; the message names the field."""


@dataclass(frozen=True)
class StageCost:
    """Per-microbatch costs of one stage.

    forward, backward_input, backward_weight: T_F, T_B, T_W in seconds.
    backward_full: T_BW of the fused backward; None means T_B + T_W.
    activation_bytes: size of the activation this stage sends to the next one.
    gradient_bytes: size of the gradient sent back to the previous stage (None: same as
        the activation arriving at this stage, i.e. the previous stage's activation_bytes).
    activation_memory: bytes an F stores until its backward.
    weight_memory: bytes a split B leaves held until its W: the part of the activations W
        still needs plus the gradients B captured for it (so it may exceed activation_memory).
    param_bytes: resident bytes of this stage's parameters, gradients and optimizer state.
    grad_accumulate: seconds of T_W / T_BW spent adding the weight gradients into those of
        earlier microbatches; the first W or BW of a stage in a step (on a rank) only
        keeps its gradients and takes that much less.
    weight_grad_bytes: bytes of this stage's weight gradients, all-reduced across the
        data-parallel replicas once per step (None: param_bytes, which calibration
        measures as the parameters' own bytes, the size of their gradients).
    optimizer_time: seconds of this stage's optimizer step, once per step (not per
        microbatch), after its gradients are all-reduced (see simulator.data_parallel).
    recompute: this stage recomputes its activations (an R before each backward) when a
        schedule is built with these costs; `--recompute` turns it on for every stage.
    recompute_fraction: T_R = recompute_fraction x T_F, seconds (1: full recomputation;
        below 1: selective, only part of the forward, e.g. attention, is re-run).
    recompute_memory: bytes an F of a recomputing stage keeps until its R (the stage
        input, plus what selective recomputation does not re-create); None: the stage
        input, i.e. the activation_bytes arriving from the previous model stage (0 for
        the first, whose input is the data). R holds activation_memory in all.
    """

    forward: float = 1.0
    backward_input: float = 1.0
    backward_weight: float = 1.0
    backward_full: float | None = None
    activation_bytes: float = 0.0
    gradient_bytes: float | None = None
    activation_memory: float = 0.0
    weight_memory: float = 0.0
    param_bytes: float = 0.0
    grad_accumulate: float = 0.0
    weight_grad_bytes: float | None = None
    optimizer_time: float = 0.0
    recompute: bool = False
    recompute_fraction: float = 1.0
    recompute_memory: float | None = None

    def check(self, where: str) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("backward_full", "gradient_bytes", "weight_grad_bytes", "recompute_memory"):
                continue
            if f.name == "recompute":
                if not isinstance(value, bool):
                    raise CostError(f"{where}.recompute must be true or false, got {value!r}")
                continue
            if not is_real(value):
                raise CostError(f"{where}.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise CostError(f"{where}.{f.name} must be finite and >= 0, got {value!r}")

    def slower(self, k: float) -> "StageCost":
        """This stage with its op times (F, B, W, BW, gradient accumulation) k times as
        long; memory, bytes and the optimizer step unchanged."""
        return replace(
            self, forward=self.forward * k, backward_input=self.backward_input * k,
            backward_weight=self.backward_weight * k,
            backward_full=None if self.backward_full is None else self.backward_full * k,
            grad_accumulate=self.grad_accumulate * k)

    def scaled(self, k: float) -> "StageCost":
        """This stage's costs for a k-fraction of it (compute and memory scale, boundary sizes do not)."""
        return replace(
            self.slower(k), activation_memory=self.activation_memory * k, weight_memory=self.weight_memory * k,
            param_bytes=self.param_bytes * k,
            weight_grad_bytes=None if self.weight_grad_bytes is None else self.weight_grad_bytes * k,
            optimizer_time=self.optimizer_time * k,
            recompute_memory=None if self.recompute_memory is None else self.recompute_memory * k)

    @property
    def synced_bytes(self) -> float:
        """Bytes of weight gradients this stage all-reduces per step."""
        return self.param_bytes if self.weight_grad_bytes is None else self.weight_grad_bytes

    def op_time(self, op: str) -> float:
        if op == F:
            return self.forward
        if op == B:
            return self.backward_input
        if op == W:
            return self.backward_weight
        if op == BW:
            return self.backward_input + self.backward_weight if self.backward_full is None else self.backward_full
        if op == R:
            return self.forward * self.recompute_fraction
        raise CostError(f"unknown op {op!r}")


def merged(stages: Sequence[StageCost]) -> StageCost:
    """One model stage made of consecutive `stages`: op times, memory, parameters and
    optimizer time add up; what crosses its boundaries is what crosses the last one's;
    it recomputes if all of them do, the recomputed share of F weighted by forward time,
    keeping what the first keeps."""
    last = stages[-1]
    full = None if all(s.backward_full is None for s in stages) else sum(s.op_time(BW) for s in stages)
    forward = sum(s.forward for s in stages)
    fraction = (sum(s.recompute_fraction * s.forward for s in stages) / forward if forward > 0
                else stages[0].recompute_fraction)
    return StageCost(
        forward=forward, backward_input=sum(s.backward_input for s in stages),
        backward_weight=sum(s.backward_weight for s in stages), backward_full=full,
        activation_bytes=last.activation_bytes, gradient_bytes=last.gradient_bytes,
        activation_memory=sum(s.activation_memory for s in stages),
        weight_memory=sum(s.weight_memory for s in stages), param_bytes=sum(s.param_bytes for s in stages),
        grad_accumulate=sum(s.grad_accumulate for s in stages),
        weight_grad_bytes=(None if all(s.weight_grad_bytes is None for s in stages)
                           else sum(s.synced_bytes for s in stages)),
        optimizer_time=sum(s.optimizer_time for s in stages),
        recompute=all(s.recompute for s in stages), recompute_fraction=fraction,
        recompute_memory=stages[0].recompute_memory)


def fsum(values) -> float:
    """math.fsum, but inf where the exact sum is beyond the largest float (where fsum
    raises OverflowError): the simulator then refuses the costs as too large."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def cut(stages: Sequence[StageCost], k: int) -> list[StageCost]:
    """Each of `stages` (consecutive model stages) cut into `k` equal parts.

    The first model stage's input is the data, which needs no gradient, so its measured
    B does next to nothing and its W does the whole backward. Its later parts do get an
    input from a part before them: their B and W take the shape of the later stages'
    (B's share of B + W, and B + W over a fused BW where both are known, since a split
    backward costs more than a fused one). With one stage there is no shape to borrow."""
    parts = [stage.scaled(1 / k) for stage in stages for _ in range(k)]
    later = stages[1:]
    b, w = fsum(s.backward_input for s in later), fsum(s.backward_weight for s in later)
    if k == 1 or not later or b + w <= 0:
        return parts
    first = parts[0]
    backward = first.backward_input + first.backward_weight
    fused = [s.backward_full for s in later]
    if first.backward_full is not None and all(f is not None and f > 0 for f in fused):
        backward = first.backward_full * (b + w) / fsum(fused)
    inner = replace(first, backward_input=backward * b / (b + w), backward_weight=backward * w / (b + w))
    return [first] + [inner] * (k - 1) + parts[k:]
