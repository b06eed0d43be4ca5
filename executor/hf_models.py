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

    def layers(self, num_model_stages: int) -> int:
        counts = self.layers_per_stage
        return sum(counts) if isinstance(counts, tuple) else counts * num_model_stages

    def param_count(self, layers: int) -> int:
        """Parameters of the whole model of `layers` blocks, counted, not built: Llama's
        blocks have 16 h^2 + 2 h (attention 4 h^2, gated MLP 12 h^2, two norms) and its
        embedding and head V h each; GPT-2's 12 h^2 + 13 h, one tied V h table and seq
        x h positions."""
        h, v = self.hidden, self.vocab
        if self.kind == "hf-llama":
            return layers * (16 * h * h + 2 * h) + 2 * v * h + h
        return layers * (12 * h * h + 13 * h) + v * h + self.seq * h + 2 * h

    def launcher_bytes(self, num_model_stages: int, microbatches: int) -> int:
        """Bytes the launcher holds to build and check the model: its parameters, the
        tokens, and one microbatch through it with autograd (each block's activations,
        its attention scores, the logits and their softmax)."""
        item = DTYPES[self.dtype].itemsize
        b, s, h, v = self.microbatch_size, self.seq, self.hidden, self.vocab
        layers = self.layers(num_model_stages)
        check = item * (layers * b * s * (24 * h + self.heads * s) + 3 * b * s * v)
        return self.param_count(layers) * item + check + 8 * microbatches * b * (s + 1)

    def check_fits(self, num_model_stages: int, microbatches: int, rank_copies: float, memory: int | None) -> None:
        """ModelError, before anything is built, when the launcher's copy and check
        (`launcher_bytes`) and the ranks' parameters and gradients (`rank_copies` copies
        of the model's) need more than `memory` bytes (None: unknown, not checked)."""
        check_layer_counts(self.layers_per_stage, num_model_stages if isinstance(self.layers_per_stage, tuple)
                           else None, least=0)
        check_layer_counts(self.layers(num_model_stages), least=0)  # the blocks in all
        if memory is None:
            return
        params = self.param_count(self.layers(num_model_stages)) * DTYPES[self.dtype].itemsize
        need = self.launcher_bytes(num_model_stages, microbatches) + 2 * rank_copies * params
        if need > memory:
            raise ModelError(f"{self.kind} with --hidden {self.hidden}, --vocab {self.vocab}, --seq {self.seq} and "
                             f"{self.layers(num_model_stages):,} blocks needs about {need / 2**30:,.1f} GiB on this "
                             f"host ({params / 2**30:,.1f} GiB of parameters) and {memory / 2**30:,.1f} GiB are "
                             "available: use a smaller --hidden, --vocab or --seq, or fewer --layers-per-stage")

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
