"""Per-layer costs measured: every layer of a model profiled on its own, so the
partitioner (`simulator.partition`) can place layers on model stages from measurements.

The model's stage modules are cut into pieces: the children of an `nn.Sequential`
(recursively) and each block of a causal LM's `Blocks`. Each piece is profiled like a
model stage (`executor.profile.profile_stage`): F, B, W and BW, what F saves and B
keeps, its parameters; the last piece with the loss. A causal LM's `Embedding` becomes
the `embedding` of the `LayerCosts` and its `Head` (with the loss) the `head`.
Units: seconds and bytes. Runs in this process, one piece at a time.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from pipesched.simulator.costs import CostModel, StageCost
from pipesched.simulator.cost_file import to_dict
from pipesched.simulator.layers import LayerCosts

from .causal_lm import Blocks, Embedding, Head
from .clock import now
from .memory import MemoryLedger
from .models import ModelError, PipelineModel
from .profile import StageProfile, profile_stage
from .stage import StageModule


def pieces_of(module: nn.Module) -> list[nn.Module]:
    """`module` cut into its layers, in order (a module that is no Sequential and no
    Blocks is one layer)."""
    if isinstance(module, nn.Sequential):
        return [p for child in module for p in pieces_of(child)]
    if isinstance(module, Blocks) and len(module.blocks) > 1:
        return [Blocks([b], module.rotary, module.config) for b in module.blocks]
    return [module]


def layer_pieces(model: PipelineModel) -> tuple[list[nn.Module], list[int]]:
    """Every layer of `model` in order, and how many of them each model stage holds."""
    per_stage = [pieces_of(stage) for stage in model.stages]
    return [p for ps in per_stage for p in ps], [len(ps) for ps in per_stage]


def _stage_cost(prof: StageProfile, sends: float) -> StageCost:
    return StageCost(forward=prof.forward, backward_input=prof.backward_input,
                     backward_weight=prof.backward_weight, backward_full=prof.backward_full,
                     activation_bytes=sends, activation_memory=prof.activation_memory,
                     weight_memory=prof.weight_memory, param_bytes=prof.param_bytes,
                     grad_accumulate=prof.grad_accumulate)


def profile_layers(model: PipelineModel, device: torch.device = torch.device("cpu"), repeats: int = 15,
                   warmup: int = 3) -> tuple[LayerCosts, list[int]]:
    """The measured `LayerCosts` of `model` (partition: the split `model` has, counted in
    layers, embedding and head not counted) and that split."""
    pieces, per_stage = layer_pieces(model)
    gen = torch.Generator().manual_seed(4321)
    x = model.inputs[0].to(device)
    target = model.targets[0].to(device)
    costs: list[StageCost] = []
    for i, piece in enumerate(pieces):
        piece = piece.to(device)
        last = i == len(pieces) - 1
        with torch.no_grad():
            y = piece(x)
        if not isinstance(y, torch.Tensor):
            raise ModelError(f"layer {i} ({type(piece).__name__}) returns {type(y).__name__}; a layer returns one tensor")
        sm = StageModule(piece, i, len(pieces), model.loss_fn, model.scale, MemoryLedger(now, list(piece.parameters())))
        grad = None if last else torch.randn(y.shape, generator=gen, dtype=torch.float64).to(device, y.dtype)
        prof = profile_stage(sm, x, target if last else None, grad, device, repeats, warmup)
        costs.append(_stage_cost(prof, 0.0 if last else float(y.numel() * y.element_size())))
        x = y.detach()
    embedding = costs.pop(0) if isinstance(pieces[0], Embedding) else None
    head = costs.pop() if isinstance(pieces[-1], Head) and costs else None
    split = list(per_stage)
    if embedding is not None:
        split[0] -= 1
    if head is not None:
        split[-1] -= 1
    return LayerCosts(tuple(costs), embedding, head, tuple(split)).check(), split


def with_measured_layers(costs: CostModel, model: PipelineModel, threads: int | None = None, repeats: int = 15,
                         warmup: int = 3) -> CostModel:
    """`costs` (calibrated per model stage) with the model stated layer by layer instead:
    `layers` measured here with `threads` intra-op threads (the ranks' own), split as the
    calibration was; the per-stage costs move to meta["per_stage_measured"] for comparison."""
    held = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        layers, _ = profile_layers(model, repeats=repeats, warmup=warmup)
    finally:
        torch.set_num_threads(held)
    meta = dict(costs.meta)
    meta["per_stage_measured"] = [to_dict(CostModel(stages=(s,)))["stages"][0] for s in costs.model_stages or ()]
    return replace(costs, model_stages=None, layers=layers, meta=meta).check()
