"""Stage models: what the executor runs on each model stage.

A `PipelineModel` is one nn.Module per model stage (one tensor in, one tensor out), a
loss on the last stage and the step's microbatches. The step's loss is
`loss_scale * sum(loss_fn(output_mb, target_mb))` (default scale 1/m, a fixed-scale mean),
so pipelined and unpipelined gradients are comparable exactly.

`ExampleModel` builds the two validation models (a stack of MLP blocks or of small
pre-norm transformer blocks), seeded per model stage so that replicas and the reference
start identical. `check_model` runs one microbatch through the whole model before any
process starts and turns every mismatch into a `ModelError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipesched.schedules.numbers import is_int

DTYPES = {"float32": torch.float32, "float64": torch.float64}
MODEL_KINDS = ("mlp", "transformer")


def check_sizes(config: object, names: tuple[str, ...]) -> None:
    """ModelError unless each named field of `config` is an integer >= 1 (its CLI flag named)."""
    for name in names:
        value = getattr(config, name)
        if not is_int(value) or value < 1:
            raise ModelError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")


class ModelError(ValueError):
    """Stage modules, microbatches or a split that cannot run as a pipeline."""


@dataclass
class PipelineModel:
    """Model stage k is `stages[k]`; microbatch i is (`inputs[i]`, `targets[i]`)."""

    stages: list[nn.Module]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    inputs: list[Tensor]
    targets: list[Tensor]
    loss_scale: float | None = None  # None: 1 / number of microbatches
    name: str = ""                   # what reports call the model (e.g. "hf-gpt2")

    @property
    def scale(self) -> float:
        return 1.0 / len(self.inputs) if self.loss_scale is None else self.loss_scale


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class MLPBlock(nn.Module):
    """x + W2 gelu(W1 x), hidden -> 4 hidden -> hidden."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: causal self-attention and a 4x MLP, each with a residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = MLPBlock(hidden)

    def forward(self, x: Tensor) -> Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return self.mlp(self.norm2(x))


def mse_loss(output: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(output, target)


MAX_BLOCKS = 10_000
"""The most blocks an example or hf-* model has in all (every model stage's together):
each is a module built in the launcher and every rank."""


def _shown(counts: tuple[int, ...]) -> str:
    text = ",".join(map(str, counts[:8])) + (",..." if len(counts) > 8 else "")
    return text if len(text) <= 80 else text[:77] + "..."


def check_layer_counts(layers_per_stage: int | tuple[int, ...], num_model_stages: int | None = None,
                       least: int = 1) -> None:
    """ModelError unless `layers_per_stage` is an integer >= 1 (every model stage) or a
    tuple of integers >= `least`, one per model stage (when their number is known), and
    the model has at most MAX_BLOCKS blocks in all."""
    if isinstance(layers_per_stage, tuple):
        if not layers_per_stage or any(not is_int(c) or c < least for c in layers_per_stage):
            raise ModelError(f"--layers-per-stage needs integers >= {least}, one per model stage, "
                             f"got {_shown(layers_per_stage)}")
        if num_model_stages is not None and len(layers_per_stage) != num_model_stages:
            raise ModelError(f"--layers-per-stage gives {len(layers_per_stage)} model stages "
                             f"({_shown(layers_per_stage)}), the schedule has {num_model_stages}")
        total = sum(layers_per_stage)
    elif not is_int(layers_per_stage) or layers_per_stage < 1:
        raise ModelError(f"--layers-per-stage must be an integer >= 1, got {layers_per_stage!r}")
    else:
        total = layers_per_stage * (num_model_stages or 1)
    if total > MAX_BLOCKS:
        shown = f"{total:,}" if total < 10 ** 30 else f"a number of {len(str(total))} digits"
        raise ModelError(f"--layers-per-stage asks for {shown} blocks in all; a model has at most {MAX_BLOCKS:,}")


def layers_of_stage(layers_per_stage: int | tuple[int, ...], model_stage: int) -> int:
    """Blocks on `model_stage`: the one count, or that stage's entry of an uneven split."""
    return layers_per_stage[model_stage] if isinstance(layers_per_stage, tuple) else layers_per_stage


@dataclass(frozen=True)
class ExampleModel:
    """The validation models. Sizes: `hidden` features, `layers_per_stage` blocks per model
    stage (one count, or a tuple with each model stage's: an uneven split), `microbatch_size`
    samples per microbatch, `seq` tokens (transformer only)."""

    kind: str = "mlp"
    hidden: int = 64
    layers_per_stage: int | tuple[int, ...] = 2
    microbatch_size: int = 8
    seq: int = 32
    dtype: str = "float32"
    seed: int = 0

    def check(self) -> "ExampleModel":
        if self.kind not in MODEL_KINDS:
            raise ModelError(f"unknown model {self.kind!r}; models are {', '.join(MODEL_KINDS)}")
        if self.dtype not in DTYPES:
            raise ModelError(f"unknown dtype {self.dtype!r}; dtypes are {', '.join(DTYPES)}")
        check_sizes(self, ("hidden", "microbatch_size", "seq"))
        check_layer_counts(self.layers_per_stage)
        if self.kind == "transformer" and self.hidden % self.heads:
            raise ModelError(f"transformer --hidden must be a multiple of {self.heads}, got {self.hidden}")
        return self

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 32)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def build_stage(self, model_stage: int) -> nn.Module:
        """Model stage `model_stage`, initialised from its own seed (identical everywhere)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 100_003 + model_stage)
            count = layers_of_stage(self.layers_per_stage, model_stage)
            if self.kind == "mlp":
                blocks = [MLPBlock(self.hidden) for _ in range(count)]
            else:
                blocks = [TransformerBlock(self.hidden, self.heads) for _ in range(count)]
            return nn.Sequential(*blocks).to(self.torch_dtype)

    def stage_param_bytes(self, model_stage: int) -> int:
        """Bytes of model stage `model_stage`'s parameters, counted without allocating
        them (one block is built on the meta device; the stage has that many of them)."""
        return layers_of_stage(self.layers_per_stage, model_stage) * self.block_param_bytes()

    def block_param_bytes(self) -> int:
        """Bytes of one block's parameters, counted, not allocated: an MLP block has
        8 h^2 + 5 h (two Linear layers), a transformer block 12 h^2 + 13 h (qkv, proj,
        the MLP and two LayerNorms)."""
        h = self.hidden
        return (8 * h * h + 5 * h if self.kind == "mlp" else 12 * h * h + 13 * h) * self.torch_dtype.itemsize

    def sample_shape(self) -> tuple[int, ...]:
        if self.kind == "mlp":
            return (self.microbatch_size, self.hidden)
        return (self.microbatch_size, self.seq, self.hidden)

    def microbatch(self, mb: int) -> tuple[Tensor, Tensor]:
        """(input, target) of microbatch `mb`, the same on every rank."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * mb + 1)
        x = torch.randn(self.sample_shape(), generator=gen, dtype=torch.float64)
        y = torch.randn(self.sample_shape(), generator=gen, dtype=torch.float64)
        return x.to(self.torch_dtype), y.to(self.torch_dtype)

    def build(self, num_model_stages: int, microbatches: int) -> PipelineModel:
        self.check()
        check_layer_counts(self.layers_per_stage, num_model_stages)
        pairs = [self.microbatch(i) for i in range(microbatches)]
        return PipelineModel([self.build_stage(k) for k in range(num_model_stages)], mse_loss,
                             [x for x, _ in pairs], [y for _, y in pairs])


def split_sequential(model: nn.Sequential, layers_per_stage: Sequence[int]) -> list[nn.Module]:
    """Cut `model` into consecutive pieces of the given numbers of layers (one per model
    stage); the pieces share the original layers."""
    sizes = list(layers_per_stage)
    if any(not is_int(n) or n < 1 for n in sizes):
        raise ModelError(f"every model stage needs at least one layer, got split {sizes}")
    if sum(sizes) != len(model):
        raise ModelError(f"split {sizes} covers {sum(sizes)} layers, the Sequential has {len(model)}")
    pieces, start = [], 0
    for n in sizes:
        pieces.append(nn.Sequential(*(model[i] for i in range(start, start + n))))
        start += n
    return pieces


def _spec(t: Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def _device_of(module: nn.Module, default: torch.device) -> torch.device:
    """Where `module`'s weights live (a stage moved to a GPU by an earlier job stays there)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return default


def check_model(model: PipelineModel, num_model_stages: int, microbatches: int) -> list[TensorSpec]:
    """Check that `model` can run a schedule with these many model stages and
    microbatches; return each model stage's output spec (what crosses each boundary).

    Runs microbatch 0 through every stage once (with autograd, on the modules' device)."""
    if not isinstance(model, PipelineModel):
        raise ModelError(f"the model must be a PipelineModel, got {type(model).__name__}")
    for name in ("stages", "inputs", "targets"):
        value = getattr(model, name)
        if not isinstance(value, (list, tuple)) or not value:
            raise ModelError(f"the model's {name} must be a non-empty list, got {type(value).__name__}")
    if not callable(model.loss_fn):
        raise ModelError(f"the model's loss_fn must be a function, got {type(model.loss_fn).__name__}")
    if len(model.stages) != num_model_stages:
        raise ModelError(f"the schedule cuts the model into {num_model_stages} model stages, "
                         f"but {len(model.stages)} stage modules were given")
    if not all(isinstance(m, nn.Module) for m in model.stages):
        raise ModelError("every model stage must be an nn.Module")
    for name, tensors in (("inputs", model.inputs), ("targets", model.targets)):
        if len(tensors) != microbatches:
            raise ModelError(f"the schedule has {microbatches} microbatches, but {len(tensors)} {name} were given")
        first = tensors[0]
        bad = next((i for i, t in enumerate(tensors)
                    if not isinstance(t, Tensor) or t.shape != first.shape or t.dtype != first.dtype), None)
        if bad is not None:
            raise ModelError(f"{name}[{bad}] differs from {name}[0] ({_spec(first)}): all microbatches "
                             "must have one shape and dtype, receive buffers are preallocated")
    specs: list[TensorSpec] = []
    x = model.inputs[0]
    for k, stage in enumerate(model.stages):
        x = x.to(_device_of(stage, x.device))
        if k > 0:
            x = x.detach().requires_grad_()
        try:
            y = stage(x)
        except Exception as exc:
            where = "the microbatch input" if k == 0 else f"the output of model stage {k - 1}"
            raise ModelError(f"model stage {k} fails on {where} ({_spec(x)}): {type(exc).__name__}: {exc}") from None
        if not isinstance(y, Tensor):
            raise ModelError(f"model stage {k} returns {type(y).__name__}; a stage returns one tensor")
        if not y.is_floating_point() or y.grad_fn is None:
            raise ModelError(f"model stage {k}'s output ({_spec(y)}) carries no gradient: it must depend "
                             "on the stage's parameters or input through differentiable ops")
        specs.append(TensorSpec(tuple(y.shape), y.dtype))
        x = y
    try:
        loss = model.loss_fn(x, model.targets[0].to(x.device))
    except Exception as exc:
        raise ModelError(f"the loss fails on the last stage's output ({_spec(x)}) and target "
                         f"({_spec(model.targets[0])}): {type(exc).__name__}: {exc}") from None
    if not isinstance(loss, Tensor) or loss.numel() != 1 or loss.grad_fn is None:
        raise ModelError("the loss must return a differentiable scalar tensor")
    return specs
