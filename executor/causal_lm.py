"""Cutting a causal language model into model stages.

`split_causal_lm(model, num_stages)` cuts a `transformers` causal LM (`LlamaForCausalLM`,
`GPT2LMHeadModel` and the families built like them) into one nn.Module per model stage:

- model stage 0: the token embedding (plus absolute position embeddings and their
  dropout where the model has them) and its share of the blocks;
- the blocks, consecutive, spread by `balance`: "even" (by count; the first and last
  stages get the fewer blocks when they do not divide evenly), "cost" (by measured
  seconds of F + BW per block, the embedding counted on the first stage and the head
  and loss on the last, minimising the slowest stage) or an explicit list of counts;
- the last model stage: its blocks, the final norm and the LM head (logits out); the
  loss (`causal_lm_loss`, cross-entropy on next tokens) is the PipelineModel's.

The pieces share the model's own modules: tied input and output embeddings stay one
Parameter, held by the first and the last stage. The executor sums the gradients of a
parameter held on several ranks (`executor.replicas`), as it does for DualPipe's
replicated stages, so every holder ends the step with the full gradient.

`causal_lm_pipeline` adds the microbatches: a batch of token sequences of length
seq + 1 becomes inputs (the first seq tokens) and targets (the next token at each
position). Tested with transformers 5.23; nothing is downloaded.
"""
from __future__ import annotations

import functools
import inspect
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipesched.schedules.numbers import is_int
from pipesched.simulator.partition import PartitionError, balanced_split, even_split

from .models import ModelError, PipelineModel

BALANCES = ("even", "cost")


@dataclass
class LMParts:
    """The pieces of a causal LM, in the order tokens pass through them."""

    tokens: nn.Module                 # token ids -> hidden states
    positions: nn.Module | None       # absolute position embeddings (GPT-2's wpe)
    dropout: nn.Module | None         # after the embeddings
    blocks: list[nn.Module]
    rotary: nn.Module | None          # rotary position embeddings computed once per stage (Llama)
    norm: nn.Module                   # the final norm
    head: nn.Module                   # hidden states -> logits
    config: Any                       # the model's config (for the attention mask)

    @property
    def tied(self) -> bool:
        """Whether the input and output embeddings are one Parameter."""
        return getattr(self.head, "weight", None) is not None and self.head.weight is getattr(self.tokens, "weight", 0)


def _first(owner: nn.Module, names: Sequence[str], kind: type | None = None) -> Any:
    for name in names:
        part = getattr(owner, name, None)
        if part is not None and (kind is None or isinstance(part, kind)):
            return part
    return None


def lm_parts(model: nn.Module) -> LMParts:
    """The pieces of `model` (a transformers `...ForCausalLM`); ModelError naming what is
    missing when it is not built like one."""
    name = type(model).__name__
    if not all(hasattr(model, a) for a in ("get_input_embeddings", "get_output_embeddings", "base_model")):
        raise ModelError(f"{name} is not a transformers causal LM (it has no get_input_embeddings, "
                         "get_output_embeddings and base_model)")
    base = model.base_model
    tokens, head = model.get_input_embeddings(), model.get_output_embeddings()
    blocks = _first(base, ("layers", "h", "blocks"), nn.ModuleList)
    norm = _first(base, ("norm", "ln_f", "final_layer_norm", "final_layernorm"))
    missing = [what for what, part in (("input embedding", tokens), ("output embedding (LM head)", head),
                                       ("block list (layers, h or blocks)", blocks),
                                       ("final norm (norm, ln_f, final_layer_norm)", norm)) if part is None]
    if missing:
        raise ModelError(f"cannot split {name}: it has no {', no '.join(missing)}")
    return LMParts(tokens, _first(base, ("wpe", "embed_positions")), _first(base, ("drop", "dropout"), nn.Dropout),
                   list(blocks), _first(base, ("rotary_emb",)), norm, head, getattr(model, "config", None))


class Embedding(nn.Module):
    """Token ids (batch, seq) -> hidden states (batch, seq, hidden)."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None = None, dropout: nn.Module | None = None):
        super().__init__()
        self.tokens, self.positions, self.dropout = tokens, positions, dropout

    def forward(self, ids: Tensor) -> Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(ids.shape[1], device=ids.device)[None])
        return h if self.dropout is None else self.dropout(h)


def _causal_mask(config: Any, h: Tensor, position_ids: Tensor) -> Tensor | None:
    """The mask the model itself would build with no padding (None where its attention
    masks causally by itself, as transformers' sdpa attention does)."""
    try:
        from transformers.masking_utils import create_causal_mask
    except ImportError:  # older transformers: sdpa masks causally when given no mask
        return None
    # transformers 5.24 renamed past_key_values to cache (the old name warns, then goes in 5.40)
    no_cache = {_cache_keyword(create_causal_mask): None}
    return create_causal_mask(config=config, inputs_embeds=h, attention_mask=None, position_ids=position_ids,
                              **no_cache)


@functools.lru_cache(maxsize=None)
def _cache_keyword(create_causal_mask: Any) -> str:
    """The name create_causal_mask takes the cache by: `cache`, or `past_key_values` before."""
    try:
        return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


class Blocks(nn.Module):
    """Consecutive decoder blocks: hidden states in, hidden states out (no padding, no cache)."""

    def __init__(self, blocks: Sequence[nn.Module], rotary: nn.Module | None, config: Any):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.rotary = rotary
        self.config = config

    def forward(self, h: Tensor) -> Tensor:
        position_ids = torch.arange(h.shape[1], device=h.device)[None]
        extra = {} if self.rotary is None else {"position_embeddings": self.rotary(h, position_ids)}
        mask = _causal_mask(self.config, h, position_ids) if self.config is not None else None
        for block in self.blocks:
            out = block(h, attention_mask=mask, position_ids=position_ids, **extra)
            h = out[0] if isinstance(out, tuple) else out  # transformers < 5 returns tuples
        return h


class Head(nn.Module):
    """Final norm and LM head: hidden states -> logits (batch, seq, vocab)."""

    def __init__(self, norm: nn.Module, head: nn.Module):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, h: Tensor) -> Tensor:
        return self.head(self.norm(h))


def causal_lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of the logits (batch, seq, vocab) against the next tokens (batch, seq)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def even_counts(num_blocks: int, num_stages: int) -> list[int]:
    """Blocks per stage, as even as counts go; the remainder goes to the middle stages
    first (the first and last already hold the embedding and the head)."""
    try:
        return even_split(num_blocks, num_stages, has_first=True, has_last=True)
    except PartitionError as exc:
        raise ModelError(f"{exc}") from None


def balanced_counts(block_costs: Sequence[float], num_stages: int, first: float = 0.0, last: float = 0.0) -> list[int]:
    """Blocks per stage (consecutive) minimising the costliest stage, where stage 0 also
    costs `first` (the embedding) and the last stage `last` (head and loss); ties go to
    the most even stage costs (`simulator.partition.balanced_split`). Middle stages get at
    least one block."""
    try:
        return balanced_split(block_costs, num_stages, first, last, has_first=True, has_last=True)
    except PartitionError as exc:
        raise ModelError(f"{exc}") from None


def _seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_costs(parts: LMParts, ids: Tensor, repeats: int = 5) -> tuple[float, list[float], float]:
    """Seconds of F + BW on microbatch `ids` (batch, seq+1 tokens) in this process, as
    (embedding, each block, head and loss); medians of `repeats` after one warm-up."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    embed, head = Embedding(parts.tokens, parts.positions, parts.dropout), Head(parts.norm, parts.head)
    with torch.no_grad():
        h = embed(inputs)
    seq = [h.detach()]
    with torch.no_grad():
        for block in parts.blocks:
            seq.append(Blocks([block], parts.rotary, parts.config)(seq[-1]))

    def embedding() -> None:
        embed(inputs).sum().backward()

    def block_op(i: int):
        def run() -> None:
            x = seq[i].clone().requires_grad_()
            Blocks([parts.blocks[i]], parts.rotary, parts.config)(x).sum().backward()
        return run

    def head_op() -> None:
        causal_lm_loss(head(seq[-1].clone().requires_grad_()), targets).backward()

    ops = [embedding] + [block_op(i) for i in range(len(parts.blocks))] + [head_op]
    held = [p.grad for p in _params(parts)]
    try:
        costs = []
        for op in ops:
            op()  # warm-up
            costs.append(_seconds(op, repeats))
    finally:
        for p, g in zip(_params(parts), held):
            p.grad = g
    return costs[0], costs[1:-1], costs[-1]


def _params(parts: LMParts) -> list[nn.Parameter]:
    modules = [parts.tokens, parts.positions, parts.norm, parts.head, *parts.blocks]
    return list({id(p): p for m in modules if m is not None for p in m.parameters()}.values())


def block_counts(parts: LMParts, num_stages: int, balance: str | Sequence[int] = "even",
                 example: Tensor | None = None) -> list[int]:
    """Blocks per model stage under `balance` ("even", "cost" with `example` token ids of
    shape (batch, seq+1), or explicit counts)."""
    n = len(parts.blocks)
    if num_stages < 1:
        raise ModelError(f"need at least one model stage, got {num_stages}")
    if isinstance(balance, str):
        if balance not in BALANCES:
            raise ModelError(f"unknown balance {balance!r}; use {' or '.join(BALANCES)} or a list of block counts")
        if n < max(0, num_stages - 2):
            raise ModelError(f"{n} blocks cannot fill {num_stages} model stages (the middle ones need a block each)")
        if balance == "even":
            return even_counts(n, num_stages)
        if example is None:
            raise ModelError('balance="cost" needs example token ids to time the blocks on')
        first, blocks, last = measure_costs(parts, example)
        return balanced_counts(blocks, num_stages, first, last)
    counts = list(balance)
    if len(counts) != num_stages or sum(counts) != n or any(
            not is_int(c) or c < 0 for c in counts):
        raise ModelError(f"block counts {counts} must be {num_stages} non-negative integers adding up to {n}")
    if any(c == 0 for c in counts[1:-1]):
        raise ModelError(f"block counts {counts}: every middle model stage needs at least one block")
    return counts


def split_causal_lm(model: nn.Module, num_stages: int, balance: str | Sequence[int] = "even",
                    example: Tensor | None = None) -> list[nn.Module]:
    """One nn.Module per model stage (see the module docstring); they share `model`'s
    modules and parameters. `example`: token ids (batch, seq+1) to time blocks on when
    `balance="cost"`."""
    parts = lm_parts(model)
    counts = block_counts(parts, num_stages, balance, example)
    stages, start = [], 0
    for k, count in enumerate(counts):
        pieces: list[nn.Module] = []
        if k == 0:
            pieces.append(Embedding(parts.tokens, parts.positions, parts.dropout))
        if count:
            pieces.append(Blocks(parts.blocks[start:start + count], parts.rotary, parts.config))
        if k == num_stages - 1:
            pieces.append(Head(parts.norm, parts.head))
        stages.append(nn.Sequential(*pieces))
        start += count
    return stages


def token_microbatches(tokens: Tensor, microbatches: int) -> tuple[list[Tensor], list[Tensor]]:
    """(inputs, targets) per microbatch from token ids (batch, seq+1): inputs are the
    first seq tokens, targets the next token at each position."""
    if tokens.dim() != 2 or tokens.shape[1] < 2 or tokens.is_floating_point():
        raise ModelError(f"tokens must be integer ids of shape (batch, seq+1), got {tuple(tokens.shape)} {tokens.dtype}")
    if tokens.shape[0] % microbatches:
        raise ModelError(f"a batch of {tokens.shape[0]} sequences does not split into {microbatches} microbatches")
    chunks = tokens.chunk(microbatches)
    return [c[:, :-1].contiguous() for c in chunks], [c[:, 1:].contiguous() for c in chunks]


def causal_lm_pipeline(model: nn.Module, num_stages: int, tokens: Tensor, microbatches: int,
                       balance: str | Sequence[int] = "even", name: str = "") -> PipelineModel:
    """`model` split into `num_stages` model stages, with `tokens` (batch, seq+1) as
    `microbatches` microbatches and the next-token cross-entropy as its loss."""
    inputs, targets = token_microbatches(tokens, microbatches)
    stages = split_causal_lm(model, num_stages, balance, tokens[: tokens.shape[0] // microbatches])
    return PipelineModel(stages, causal_lm_loss, inputs, targets, name=name or type(model).__name__)
