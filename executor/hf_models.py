"""Tiny transformers language models with random weights: the `hf-llama` and `hf-gpt2`
presets (GPT-2 ties its input and output embeddings; Llama does not).

Built from a config (nothing is downloaded), seeded so that every rank and the
reference start identical, dropout off so a pipelined step equals the unpipelined
one. Needs the `transformers` package (`pip install 'pipesched[hf]'`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .causal_lm import causal_lm_pipeline
from .models import DTYPES, ModelError, PipelineModel, check_layer_counts, check_sizes

HF_PRESETS = ("hf-llama", "hf-gpt2")
INSTALL = "pip install 'pipesched[hf]'"


class MissingTransformers(ModelError):
    """The transformers package is not installed."""


def import_transformers():
    """The transformers module, or MissingTransformers saying how to install it."""
    try:
        import transformers
    except ImportError as exc:
        raise MissingTransformers(f"the hf-* models need the transformers package ({INSTALL}): {exc}") from None
    return transformers


@dataclass(frozen=True)
class HFModel:
    """A preset: `layers_per_stage` blocks per model stage (or a tuple with each model
    stage's; the first and last may hold none, they hold the embedding and the head) of `hidden` features, a
    vocabulary of `vocab` tokens, microbatches of `microbatch_size` sequences of `seq`
    tokens."""

    kind: str = "hf-llama"
    hidden: int = 64
    layers_per_stage: int | tuple[int, ...] = 1
    microbatch_size: int = 4
    seq: int = 32
    vocab: int = 2048
    dtype: str = "float32"
    seed: int = 0

    def check(self) -> "HFModel":
        if self.kind not in HF_PRESETS:
            raise ModelError(f"unknown preset {self.kind!r}; presets are {', '.join(HF_PRESETS)}")
        if self.dtype not in DTYPES:
            raise ModelError(f"unknown dtype {self.dtype!r}; dtypes are {', '.join(DTYPES)}")
        check_sizes(self, ("hidden", "microbatch_size", "seq", "vocab"))
        check_layer_counts(self.layers_per_stage, least=0)
        if self.hidden % (2 * self.heads):
            raise ModelError(f"{self.kind} --hidden must be a multiple of {2 * self.heads}, got {self.hidden}")
        return self

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 32)

    def causal_lm(self, layers: int) -> nn.Module:
        """The whole model (`layers` blocks), initialised from the seed, in `dtype`."""
        transformers = import_transformers()
        if self.kind == "hf-llama":
            config = transformers.LlamaConfig(
                vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=4 * self.hidden,
                num_hidden_layers=layers, num_attention_heads=self.heads, num_key_value_heads=self.heads,
                max_position_embeddings=max(self.seq, 16), tie_word_embeddings=False)
            cls = transformers.LlamaForCausalLM
        else:
            config = transformers.GPT2Config(
                vocab_size=self.vocab, n_embd=self.hidden, n_layer=layers, n_head=self.heads, n_positions=self.seq,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                bos_token_id=0, eos_token_id=0)
            cls = transformers.GPT2LMHeadModel
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = cls(config)
        return model.to(DTYPES[self.dtype])

    def tokens(self, microbatches: int) -> torch.Tensor:
        """Token ids (microbatches * microbatch_size, seq + 1), the same on every rank."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 17)
        return torch.randint(0, self.vocab, (microbatches * self.microbatch_size, self.seq + 1), generator=gen)

    def build(self, num_model_stages: int, microbatches: int) -> PipelineModel:
        self.check()
        counts = self.layers_per_stage
        if isinstance(counts, tuple):
            check_layer_counts(counts, num_model_stages, least=0)
            model = self.causal_lm(sum(counts))
            return causal_lm_pipeline(model, num_model_stages, self.tokens(microbatches), microbatches,
                                      balance=list(counts), name=self.kind)
        model = self.causal_lm(counts * num_model_stages)
        return causal_lm_pipeline(model, num_model_stages, self.tokens(microbatches), microbatches, name=self.kind)
