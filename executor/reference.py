"""The same model without pipelining, and the comparison with a pipelined step.

The reference runs all model stages in order on each microbatch (same initial weights,
same microbatches, same loss scale) on CPU, one backward per microbatch, gradients added
in microbatch order. A parameter used by several model stages (tied embeddings) gets
its full gradient in each of them, as the pipelined holders do after their exchange.

Relative error of a gradient tensor: max |pipelined - reference| / max |reference|
(elementwise, normalised by the tensor's largest reference entry); the loss's:
|L - L_ref| / |L_ref|.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from .models import PipelineModel

# well above the rounding of a pipelined step (docs/executor.md#correctness gives the errors seen)
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}
TINY = 1e-30


@dataclass
class Check:
    loss: float
    reference_loss: float
    loss_rel_error: float
    max_grad_rel_error: float
    worst: str          # which parameter has the largest error
    tolerance: float
    replicas_identical: bool = True  # every copy of a replicated model stage holds the same gradient

    @property
    def loss_matches(self) -> bool:
        return self.loss_rel_error <= self.tolerance

    @property
    def grads_match(self) -> bool:
        return self.max_grad_rel_error <= self.tolerance

    def to_dict(self) -> dict:
        return {"loss": self.loss, "reference_loss": self.reference_loss, "loss_rel_error": self.loss_rel_error,
                "max_grad_rel_error": self.max_grad_rel_error, "worst_parameter": self.worst,
                "tolerance": self.tolerance, "loss_matches_reference": self.loss_matches,
                "grads_match_reference": self.grads_match, "replicas_identical": self.replicas_identical}


def reference_step(model: PipelineModel) -> tuple[float, list[list[Tensor | None]]]:
    """(loss, gradients per model stage in `parameters()` order) without pipelining."""
    stages = [m.cpu() for m in copy.deepcopy(list(model.stages))]  # one copy: tied parameters stay tied
    params = [[p for p in s.parameters() if p.requires_grad] for s in stages]
    flat = [p for ps in params for p in ps]  # a tied parameter appears once per stage using it
    total = 0.0  # added as Python floats in microbatch order, like the pipelined losses
    grads: list[Tensor | None] = [None] * len(flat)
    for x, target in zip(model.inputs, model.targets):
        for stage in stages:
            x = stage(x.cpu())
        loss = model.loss_fn(x, target.cpu()) * model.scale
        for i, g in enumerate(torch.autograd.grad(loss, flat, allow_unused=True)):
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g
        total += float(loss.detach())
    out, at = [], 0
    for ps in params:
        out.append(grads[at:at + len(ps)])
        at += len(ps)
    return total, out


def rel_error(got: Tensor | None, want: Tensor | None) -> float:
    if want is None and got is None:
        return 0.0
    want = torch.zeros_like(got) if want is None else want
    got = torch.zeros_like(want) if got is None else got.to(want.device, want.dtype)
    return float((got - want).abs().max() / max(float(want.abs().max()), TINY))


def compare(model: PipelineModel, loss: float, grads: dict[int, list[Tensor | None]],
            replicas_identical: bool = True) -> Check:
    """Compare a pipelined step's loss and gradients (`grads[model_stage]`, in
    `parameters()` order) with the reference."""
    ref_loss, ref_grads = reference_step(model)
    names = [[n for n, p in m.named_parameters() if p.requires_grad] for m in model.stages]
    worst, where = 0.0, ""
    for k, want in enumerate(ref_grads):
        got = grads[k]
        for name, g, r in zip(names[k], got, want):
            err = rel_error(g, r)
            if err > worst or not where:
                worst, where = err, f"model stage {k}: {name}"
    dtype = model.inputs[0].dtype
    return Check(loss, ref_loss, abs(loss - ref_loss) / max(abs(ref_loss), TINY), worst, where,
                 TOLERANCE.get(dtype, 1e-5), replicas_identical)
