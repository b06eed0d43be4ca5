"""One model stage on one rank: F, the fused BW, the split B and W, and R.

A recomputed stage runs F under no_grad keeping only its input (and the RNG state), and
R re-runs the forward with autograd right before the backward, which then proceeds as
without recomputation (fused or split).

Every virtual stage of a rank that runs the same model stage shares one `StageModule`
(so their gradients add up in the same `.grad`). Tensors autograd saves during F go
through saved-tensor hooks into `SavedBox`es that the memory ledger counts until the
backward releases them; see `executor.memory` for what is counted.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge, saved_tensors_hooks

from . import split_backward
from .memory import MemoryLedger


class SavedBox:
    """A tensor autograd saved for backward, counted while held. The graph holds the box
    (the runtime only a weak reference), so when autograd frees a node's saved tensors
    (after running it without retain_graph) the box dies and is released at once."""

    __slots__ = ("tensor", "key", "ledger", "b_only", "__weakref__")

    def __init__(self, tensor: Tensor, ledger: MemoryLedger):
        self.tensor: Tensor | None = tensor
        self.ledger = ledger
        self.key = ledger.hold(tensor)
        self.b_only = False  # unpacked by an input-side node during a split B

    def free(self) -> None:
        if self.tensor is not None:
            self.tensor = None
            self.ledger.release(self.key)

    def __del__(self) -> None:
        self.free()


class _UnpackWatch:
    """During a split B: whether it runs and which intermediate node is running (None:
    an input-side node)."""

    active = False
    node: Node | None = None


_watch = _UnpackWatch()


def _unpack(box: SavedBox) -> Tensor:
    if _watch.active and _watch.node is None:
        box.b_only = True
    if box.tensor is None:
        raise RuntimeError("a saved tensor released after B was needed again (executor bug)")
    return box.tensor


def _alive(boxes: list[weakref.ref]) -> list[SavedBox]:
    return [b for b in (r() for r in boxes) if b is not None and b.tensor is not None]


@dataclass
class ForwardState:
    """What F leaves for its backward."""

    mb: int
    out: GradientEdge            # the stage output (or loss) in the graph, without its data
    x: Tensor | None             # the stage input, when it needs a gradient
    x_key: int | None
    boxes: list[weakref.ref]     # to the SavedBoxes of this F (the graph holds them)
    loss: Tensor | None = None   # the scaled microbatch loss on the last stage
    rng: tuple | None = None     # a no-grad F for recomputation: the RNG states to replay in R


@dataclass
class WeightState:
    """What B leaves for W: the parameter groups with their captured gradients."""

    mb: int
    groups: list[split_backward.WeightGroup]
    boxes: list[weakref.ref]
    keys: list[int | None] = field(default_factory=list)  # ledger keys of the captured gradients


class StageModule:
    """Model stage `model_stage` of a `num_model_stages`-stage model on this rank."""

    def __init__(self, module: nn.Module, model_stage: int, num_model_stages: int, loss_fn, loss_scale: float,
                 ledger: MemoryLedger):
        self.module = module
        self.model_stage = model_stage
        self.is_first = model_stage == 0
        self.is_last = model_stage == num_model_stages - 1
        self.loss_fn = loss_fn
        self.loss_scale = loss_scale
        self.ledger = ledger
        self.params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, mb: int, x: Tensor, target: Tensor | None) -> tuple[ForwardState, Tensor | None]:
        """F: run the stage, keep its graph; return the state and the output to pass on
        (None on the last stage, whose output is the loss)."""
        boxes: list[weakref.ref] = []
        ledger = self.ledger

        def pack(t: Tensor) -> SavedBox:
            box = SavedBox(t, ledger)
            boxes.append(weakref.ref(box))
            return box

        if not self.is_first:
            x.requires_grad_()
        with saved_tensors_hooks(pack, _unpack):
            y = self.module(x)
            loss = self.loss_fn(y, target) * self.loss_scale if self.is_last else None
        root = loss if loss is not None else y
        keep_x = None if self.is_first else x
        state = ForwardState(mb, get_gradient_edge(root), keep_x,
                             None if keep_x is None else ledger.hold(keep_x), boxes,
                             None if loss is None else loss.detach())
        return state, None if self.is_last else y.detach()

    def forward_for_recompute(self, mb: int, x: Tensor, target: Tensor | None) -> tuple[ForwardState, Tensor | None]:
        """F of a recomputed stage: the output without a graph; only the input (held in
        the ledger unless it is the data) and the RNG states are kept for R."""
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None)
        with torch.no_grad():
            y = self.module(x)
            loss = self.loss_fn(y, target) * self.loss_scale if self.is_last else None
        key = None if self.is_first else self.ledger.hold(x)
        state = ForwardState(mb, None, x, key, [], None if loss is None else loss.detach(), rng)
        return state, None if self.is_last else y

    def recompute(self, state: ForwardState, target: Tensor | None) -> ForwardState:
        """R: the forward again with autograd, from the input F kept and with F's RNG
        states (so dropout draws the same masks): the state a normal F leaves."""
        cpu, device = state.rng
        x = state.x.detach() if self.is_first else state.x
        with torch.random.fork_rng(devices=[x.device] if device is not None else []):
            torch.set_rng_state(cpu)
            if device is not None:
                torch.cuda.set_rng_state(device, x.device)
            full, _ = self.forward(state.mb, x, target)
        self.ledger.release(state.x_key)  # `full` holds the input now
        state.x, state.x_key = None, None
        return full

    def output_grad(self, state: ForwardState, grad: Tensor | None) -> Tensor:
        if self.is_last:
            return torch.ones((), dtype=state.loss.dtype, device=state.loss.device)
        assert grad is not None
        return grad

    def backward_full(self, state: ForwardState, grad: Tensor | None) -> Tensor | None:
        """BW: accumulate the parameter gradients; return the input gradient (None on
        the first stage)."""
        dx = split_backward.backward_full(state.out, self.output_grad(state, grad), state.x, self.params)
        self._drop(state)
        return dx

    def backward_input(self, state: ForwardState, grad: Tensor | None) -> tuple[Tensor | None, WeightState]:
        """B: the input gradient now; what W needs is kept, the rest released."""
        def observe(node: Node | None) -> None:
            _watch.node = node

        _watch.active, _watch.node = True, None
        try:
            dx, groups = split_backward.backward_input(state.out, self.output_grad(state, grad), state.x,
                                                       self.params, observe)
        finally:
            _watch.active, _watch.node = False, None
        if not split_backward.shares_parameters(groups):
            for box in _alive(state.boxes):
                if box.b_only:  # only input-side nodes used it, and they never run again
                    box.free()
        held = WeightState(state.mb, groups, state.boxes)
        for g in groups:
            for grads in g.captured:
                held.keys.extend(self.ledger.hold(t) for t in grads or () if t is not None)
        self._drop(state)
        return dx, held

    def backward_weight(self, held: WeightState) -> None:
        """W: accumulate the parameter gradients from what B kept."""
        split_backward.backward_weight(held.groups)
        for key in held.keys:
            self.ledger.release(key)
        for box in _alive(held.boxes):  # saved by nodes W did not need to run
            box.free()
        held.groups, held.boxes, held.keys = [], [], []

    def _drop(self, state: ForwardState) -> None:
        """Forget the forward: the graph above what W holds dies here."""
        self.ledger.release(state.x_key)
        if state.x is not None:
            state.x.grad = None
        state.x, state.x_key, state.out, state.boxes = None, None, None, []


def held_bytes(boxes: list[weakref.ref], groups: list[split_backward.WeightGroup]) -> int:
    """Bytes of distinct storages still held by `boxes` and the groups' captured gradients."""
    seen: dict[int, int] = {}
    for box in _alive(boxes):
        if box.key is not None:
            seen[box.key] = box.tensor.untyped_storage().nbytes()
    for group in groups:
        for grads in group.captured:
            for t in grads or ():
                if t is not None:
                    seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())
