"""Per-layer costs: a model stated layer by layer, and the model stages a split makes of it.

Every layer, and the embedding (on the first model stage) and the LM head with the loss
(on the last), has the fields of a `StageCost` (seconds and bytes per microbatch); a
layer's `activation_bytes` is the size of its output, sent on when the layer ends a
model stage. A model stage's costs are the sums of its pieces' times and memories, its
`activation_bytes` that of its last piece before the head.

`LayerCosts.split(S)` places the layers on S model stages: "balanced" (the partitioner,
`simulator.partition`, on the weight `objective` names), "even" (by count) or explicit
counts. In a cost file this is the `layers` section (see docs/partition.md), read and
written by `simulator.cost_file`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from pipesched.schedules.numbers import is_int

from .stage_costs import CostError, StageCost, fsum
from .partition import PartitionError, balanced_split, check_counts, even_split, stage_loads

PARTITIONS = ("balanced", "even")
OBJECTIVES = {
    "fbw": "F + B + W: a stage's whole work per microbatch (every schedule runs each op once)",
    "fb": "F + B: the work on the critical path of zero-bubble schedules, whose W fill bubbles",
    "f": "F alone",
}
OBJECTIVE_LABELS = {"fbw": "F+B+W", "fb": "F+B", "f": "F"}


def piece_weight(cost: StageCost, objective: str) -> float:
    """Seconds the partitioner balances for one layer (or extra) under `objective`."""
    if objective == "f":
        return cost.forward
    if objective == "fb":
        return cost.forward + cost.backward_input
    return cost.forward + cost.backward_input + cost.backward_weight


def sum_costs(pieces: Sequence[StageCost], boundary: float) -> StageCost:
    """One model stage made of `pieces` (in order); it sends `boundary` bytes on. Times,
    memory, parameters, weight gradients and the optimizer step add up; the gradient it
    sends back is its first piece's. It recomputes when every piece does (R re-running
    the share of F its pieces re-run, keeping what the first keeps)."""
    def total(name: str) -> float:
        return fsum(getattr(p, name) for p in pieces)

    fused = [p.backward_full for p in pieces]
    backward_full = None if all(b is None for b in fused) else fsum(
        p.backward_input + p.backward_weight if p.backward_full is None else p.backward_full for p in pieces)
    # None where no piece states its weight gradients: the stage all-reduces param_bytes then
    grads = None if all(p.weight_grad_bytes is None for p in pieces) else fsum(p.synced_bytes for p in pieces)
    forward = total("forward")
    recompute = bool(pieces) and all(p.recompute for p in pieces)
    fraction = (fsum(p.recompute_fraction * p.forward for p in pieces) / forward if recompute and forward > 0
                else pieces[0].recompute_fraction if pieces else 1.0)
    return StageCost(forward=forward, backward_input=total("backward_input"),
                     backward_weight=total("backward_weight"), backward_full=backward_full,
                     activation_bytes=boundary, gradient_bytes=pieces[0].gradient_bytes if pieces else None,
                     activation_memory=total("activation_memory"), weight_memory=total("weight_memory"),
                     param_bytes=total("param_bytes"), grad_accumulate=total("grad_accumulate"),
                     weight_grad_bytes=grads, optimizer_time=total("optimizer_time"), recompute=recompute,
                     recompute_fraction=fraction, recompute_memory=pieces[0].recompute_memory if pieces else None)


@dataclass(frozen=True)
class LayerCosts:
    """A model as consecutive layers (each a StageCost of that one layer), with an
    optional `embedding` before them and `head` (LM head + loss) after them.
    `partition`: "balanced", "even" or layers per model stage; `objective`: the weight
    "balanced" evens out (see OBJECTIVES)."""

    layers: tuple[StageCost, ...]
    embedding: StageCost | None = None
    head: StageCost | None = None
    partition: str | tuple[int, ...] = "balanced"
    objective: str = "fbw"

    def check(self) -> "LayerCosts":
        if not self.layers:
            raise CostError("layers needs at least one layer (count >= 1 or a non-empty list)")
        for i, layer in enumerate(self.layers):
            layer.check(f"layers.list[{i}]")
        for name in ("embedding", "head"):
            if getattr(self, name) is not None:
                getattr(self, name).check(f"layers.{name}")
        if self.objective not in OBJECTIVES:
            raise CostError(f"layers.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if isinstance(self.partition, str):
            if self.partition not in PARTITIONS:
                raise CostError(f"layers.partition must be balanced, even or a list of layer counts, "
                                f"got {self.partition!r}")
        elif not isinstance(self.partition, tuple) or not self.partition or \
                any(not is_int(c) or c < 0 for c in self.partition):
            raise CostError(f"layers.partition must be balanced, even or a list of layer counts >= 0, "
                            f"got {self.partition!r}")
        return self

    def weights(self) -> tuple[list[float], float, float]:
        """(each layer's, the embedding's, the head's) weight under the objective, seconds."""
        def w(c: StageCost | None) -> float:
            return 0.0 if c is None else piece_weight(c, self.objective)
        return [w(c) for c in self.layers], w(self.embedding), w(self.head)

    def split(self, num_stages: int, partition: str | Sequence[int] | None = None) -> list[int]:
        """Layers per model stage for `num_stages` stages under `partition` (default: this
        model's); CostError when it cannot be (more stages than layers, bad counts)."""
        how = self.partition if partition is None else partition
        n, has_first, has_last = len(self.layers), self.embedding is not None, self.head is not None
        try:
            if how == "even":
                return even_split(n, num_stages, has_first, has_last)
            if how == "balanced":
                weights, first, last = self.weights()
                return balanced_split(weights, num_stages, first, last, has_first, has_last)
            return check_counts(how, n, num_stages, has_first, has_last)
        except PartitionError as exc:
            raise CostError(str(exc)) from None

    def loads(self, counts: Sequence[int]) -> list[float]:
        """Each model stage's weight (seconds) under the split `counts`."""
        weights, first, last = self.weights()
        return stage_loads(weights, counts, first, last)

    def split_costs(self, num_stages: int) -> list[StageCost]:
        """`stage_costs(split(num_stages))`, worked out once per number of stages: a
        search simulates hundreds of schedules of the same few splits (CostError as
        `split`)."""
        memo = self.__dict__.get("_split_memo")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_split_memo", memo)  # frozen: a cache, not a field
        if num_stages not in memo:
            memo[num_stages] = self.stage_costs(self.split(num_stages))
        return list(memo[num_stages])

    def stage_costs(self, counts: Sequence[int]) -> list[StageCost]:
        """The per-model-stage costs of the split `counts` (one StageCost per stage)."""
        out, start = [], 0
        for k, c in enumerate(counts):
            pieces = list(self.layers[start:start + c])
            if k == 0 and self.embedding is not None:
                pieces.insert(0, self.embedding)
            boundary = pieces[-1].activation_bytes if pieces else 0.0
            if k == len(counts) - 1:
                boundary = 0.0  # the last stage sends nothing on
                if self.head is not None:
                    pieces.append(self.head)
            out.append(sum_costs(pieces, boundary))
            start += c
        return out


def with_partition(model: LayerCosts, partition: str | Sequence[int]) -> LayerCosts:
    """`model` split another way ("balanced", "even" or counts)."""
    return replace(model, partition=partition if isinstance(partition, str) else tuple(partition)).check()


def split_summary(model: LayerCosts, num_stages: int) -> dict:
    """The split a schedule of `num_stages` model stages gets: how it was chosen, layers
    per stage and each stage's weight (seconds), for reports."""
    counts = model.split(num_stages)
    how = model.partition if isinstance(model.partition, str) else "given"
    return {"partition": how, "objective": model.objective, "layers_per_stage": counts,
            "stage_seconds": model.loads(counts)}
