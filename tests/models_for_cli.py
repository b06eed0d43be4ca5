"""Models for `--model package.module:function` and the tied-weight tests, in plain torch
(no transformers): a tiny language model whose input embedding is its output projection,
and functions that go wrong in each way the CLI must report."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipesched.executor.models import PipelineModel

VOCAB, HIDDEN, SEQ, BATCH = 16, 8, 4, 2


class Embed(nn.Module):
    def __init__(self, table: nn.Embedding):
        super().__init__()
        self.table = table

    def forward(self, ids: Tensor) -> Tensor:
        return self.table(ids)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: Tensor) -> Tensor:
        return h + torch.tanh(self.fc(h))


class TiedHead(nn.Module):
    """A block, then logits through the input embedding's own table."""

    def __init__(self, table: nn.Embedding):
        super().__init__()
        self.block, self.table = Block(), table

    def forward(self, h: Tensor) -> Tensor:
        return F.linear(self.block(h), self.table.weight)


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tied_lm(num_stages: int, microbatches: int) -> PipelineModel:
    """Embedding on stage 0, a block per middle stage, a block and the tied head last."""
    torch.manual_seed(0)
    table = nn.Embedding(VOCAB, HIDDEN)
    stages = [nn.Sequential(Embed(table), Block())] + [Block() for _ in range(num_stages - 2)] + [TiedHead(table)]
    stages = [s.double() for s in stages]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (microbatches, BATCH, SEQ + 1), generator=gen)
    return PipelineModel(stages, next_token_loss, [t[:, :-1] for t in tokens], [t[:, 1:] for t in tokens],
                         name="tied-lm")


def not_a_model(num_stages: int, microbatches: int):
    return [nn.Linear(2, 2) for _ in range(num_stages)], next_token_loss


def unpicklable(num_stages: int, microbatches: int) -> PipelineModel:
    model = tied_lm(num_stages, microbatches)
    model.loss_fn = lambda logits, targets: next_token_loss(logits, targets)
    return model


def fails(num_stages: int, microbatches: int) -> PipelineModel:
    raise RuntimeError("no data here")


def wrong_stage_count(num_stages: int, microbatches: int) -> PipelineModel:
    return tied_lm(num_stages + 1, microbatches)


NOT_CALLABLE = 3
