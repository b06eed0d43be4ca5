"""A decoder-only transformer described by its shapes: read from a Hugging Face
`config.json` or taken from a named preset (GPT-3, Llama 3). No torch, no weights.

`ModelConfig` holds what the cost estimate (`simulator.estimate`) needs: layers, hidden
size, MLP width, heads (query and key/value), vocabulary, whether the MLP is gated (Llama:
three matrices, SwiGLU) or not (GPT-2: two), the norm, biases, position embeddings, the
activation and dropout, and whether the input and output embeddings are tied.

Presets, with the shapes their papers publish:

- GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1): 125M,
  350M, 1.3B, 2.7B, 6.7B, 13B, 175B; vocabulary 50257, context 2048, MLP 4 x d_model,
  learned positions, tied embeddings, LayerNorm, biases. Two entries of that table do not
  add up (1.3B: 24 heads of 128 in a model of 2048; 13B: d_model 5140 with 40 heads of
  128): these use 16 heads of 128 and d_model 5120, as the public reimplementations do.
- Llama 3 (Llama Team 2024, "The Llama 3 Herd of Models", Table 3): 8B, 70B, 405B;
  vocabulary 128256, 8 key/value heads, SwiGLU, RMSNorm, RoPE, no biases, untied.

Units: counts of parameters and elements; `ModelConfigError` (a ValueError) names the
field and its bound for anything unusable.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipesched.schedules.documents import read_document

from pipesched.schedules.numbers import is_int

__all__ = ["ModelConfig", "ModelConfigError", "PRESETS", "preset", "from_hf_dict", "load_hf_config", "BOUNDS",
           "NORMS", "ACTIVATIONS"]

NORMS = ("layernorm", "rmsnorm")
# activations as implemented: native kernels ("gelu", "gelu_tanh", "silu", "relu") or
# written out in Python ops ("gelu_new": transformers' GPT-2 default)
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_new", "silu", "relu")

# Bounds on every size: far beyond any model trained so far, so that a typo fails at
# once instead of producing astronomically large (or overflowing) costs.
BOUNDS = {"layers": 100_000, "hidden": 1 << 20, "ffn": 1 << 24, "heads": 1 << 16, "kv_heads": 1 << 16,
          "head_dim": 1 << 16, "vocab": 1 << 25, "positions": 1 << 24}
MAX_CONFIG_BYTES = 10 * 2 ** 20  # a config.json larger than this is not a config


class ModelConfigError(ValueError):
    """A model description that cannot be estimated; the message names the field."""


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer: `layers` blocks of width `hidden`, an MLP of width
    `ffn` (gated: gate and up projections, then down; else up then down), attention with
    `heads` query heads and `kv_heads` key/value heads of `head_dim` (None: hidden //
    heads), a vocabulary of `vocab` tokens. `positions`: rows of a learned position
    embedding (0: rotary, nothing learned). `bias`: the linear layers have biases."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int
    kv_heads: int | None = None
    head_dim: int | None = None
    gated: bool = False
    tied: bool = False
    norm: str = "layernorm"
    bias: bool = False
    positions: int = 0
    activation: str = "gelu"
    dropout: bool = False

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)

    # --- shapes -------------------------------------------------------------------
    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.heads * self.dim_head

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): kv_heads x head_dim."""
        return self.kv_heads * self.dim_head

    @property
    def rope(self) -> bool:
        return self.positions == 0

    # --- parameters ----------------------------------------------------------------
    def norm_params(self) -> int:
        """One norm's parameters: a scale (and a shift for LayerNorm)."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def layer_matrices(self) -> list[tuple[str, int, int, bool]]:
        """The weight matrices of one block: (name, in, out, split over tensor-parallel
        ranks by its output (column) or else by its input (row)), in forward order."""
        h, f = self.hidden, self.ffn
        return [("qkv", h, self.q_width + 2 * self.kv_width, True), ("proj", self.q_width, h, False),
                ("mlp_in", h, (2 if self.gated else 1) * f, True), ("mlp_out", f, h, False)]

    def layer_params(self) -> int:
        """Parameters of one transformer block (two norms, attention, MLP, biases)."""
        n = sum(i * o for _, i, o, _ in self.layer_matrices()) + 2 * self.norm_params()
        if self.bias:
            n += sum(o for _, _, o, _ in self.layer_matrices())
        return n

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.positions * self.hidden

    def head_params(self) -> int:
        """The final norm and the LM head (the head's matrix is the embedding's when tied)."""
        return self.norm_params() + (0 if self.tied else self.vocab * self.hidden)

    def total_params(self) -> int:
        """All parameters, a tied embedding counted once (as papers count them)."""
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    # --- checks ----------------------------------------------------------------------
    def check(self) -> "ModelConfig":
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if name == "head_dim" and value is None:
                continue
            least = 0 if name == "positions" else 1
            if not is_int(value) or not least <= value <= bound:
                raise ModelConfigError(f"{self.name}: {name} must be an integer in {least}..{bound:,}, got {value!r}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ModelConfigError(f"{self.name}: hidden ({self.hidden}) is not a multiple of heads ({self.heads}); "
                                   "give head_dim")
        if self.heads % self.kv_heads:
            raise ModelConfigError(f"{self.name}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.norm not in NORMS:
            raise ModelConfigError(f"{self.name}: norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise ModelConfigError(f"{self.name}: activation must be one of {', '.join(ACTIVATIONS)}, "
                                   f"got {self.activation!r}")
        for flag in ("gated", "tied", "bias", "dropout"):
            if not isinstance(getattr(self, flag), bool):
                raise ModelConfigError(f"{self.name}: {flag} must be true or false, got {getattr(self, flag)!r}")
        return self

    def describe(self) -> str:
        mlp = "gated MLP (3 matrices)" if self.gated else "MLP (2 matrices)"
        kv = f", {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return (f"{self.name}: {self.layers} layers, hidden {self.hidden}, {mlp} {self.ffn}, {self.heads} heads{kv}, "
                f"vocab {self.vocab}{', tied' if self.tied else ''}; {self.total_params() / 1e9:.3g} B parameters")


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(name, layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads, vocab=50257, tied=True,
                       norm="layernorm", bias=True, positions=2048, activation="gelu")


def _llama3(name: str, layers: int, hidden: int, ffn: int, heads: int) -> ModelConfig:
    return ModelConfig(name, layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=8, vocab=128256,
                       gated=True, tied=False, norm="rmsnorm", bias=False, positions=0, activation="silu")


PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    _gpt3("gpt3-125m", 12, 768, 12),
    _gpt3("gpt3-350m", 24, 1024, 16),
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    _llama3("llama3-8b", 32, 4096, 14336, 32),
    _llama3("llama3-70b", 80, 8192, 28672, 64),
    _llama3("llama3-405b", 126, 16384, 53248, 128),
)}

# the parameter counts the papers publish, for the presets' check
PUBLISHED_PARAMS = {"gpt3-125m": 125e6, "gpt3-350m": 350e6, "gpt3-1.3b": 1.3e9, "gpt3-2.7b": 2.7e9,
                    "gpt3-6.7b": 6.7e9, "gpt3-13b": 13e9, "gpt3-175b": 175e9,
                    "llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama3-405b": 405e9}


def preset(name: str) -> ModelConfig:
    """A named preset (case-insensitive; `llama3-70b`, `gpt3-175b`, ...)."""
    key = name.strip().lower().replace("llama-3", "llama3").replace("gpt-3", "gpt3").replace("_", "-")
    if key not in PRESETS:
        raise ModelConfigError(f"unknown model preset {name!r}; presets are {', '.join(PRESETS)}")
    return PRESETS[key]


# --- Hugging Face config.json --------------------------------------------------------

GATED_TYPES = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "phi3", "granite",
               "cohere", "internlm2", "yi", "deepseek", "starcoder2_gated"}
GPT2_TYPES = {"gpt2", "gpt_bigcode", "codegen", "gptj"}
_ACT_NAMES = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh",
              "gelu_python": "gelu", "silu": "silu", "swish": "silu", "swiglu": "silu", "relu": "relu"}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _get(d: dict, *names: str, default: Any = None) -> Any:
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


def from_hf_dict(d: Any, name: str = "config.json") -> ModelConfig:
    """A ModelConfig from a Hugging Face decoder-only config (the dict of config.json).

    GPT-2-style names (`n_layer`, `n_embd`, `n_head`, `n_inner`) and Llama-style names
    (`num_hidden_layers`, `hidden_size`, `intermediate_size`, `num_attention_heads`,
    `num_key_value_heads`) are both read. The MLP is gated (three matrices) for
    Llama-family `model_type`s, or when the activation is SiLU and the type is not
    GPT-2's; GPT-2 types get LayerNorm, biases and learned positions."""
    if not isinstance(d, dict):
        raise ModelConfigError(f"{name} must hold a JSON object, got {type(d).__name__}")
    if isinstance(d.get("text_config"), dict):  # multimodal wrappers: the language model's part
        d = {**d["text_config"], "model_type": d["text_config"].get("model_type", d.get("model_type"))}
    moe = [k for k in _MOE_KEYS if isinstance(d.get(k), int) and d[k] > 1]
    if moe:
        raise ModelConfigError(f"{name}: a mixture of experts ({moe[0]} = {d[moe[0]]}) is not modelled")
    if d.get("is_encoder_decoder"):
        raise ModelConfigError(f"{name}: an encoder-decoder model is not modelled (decoder-only transformers only)")
    kind = str(d.get("model_type", "")).lower()
    gpt2_style = kind in GPT2_TYPES or ("n_embd" in d and "hidden_size" not in d)
    layers = _get(d, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(d, "hidden_size", "n_embd", "d_model")
    heads = _get(d, "num_attention_heads", "n_head")
    vocab = _get(d, "vocab_size")
    missing = [k for k, v in (("num_hidden_layers/n_layer", layers), ("hidden_size/n_embd", hidden),
                              ("num_attention_heads/n_head", heads), ("vocab_size", vocab)) if v is None]
    if missing:
        raise ModelConfigError(f"{name} has no {missing[0]}")
    ffn = _get(d, "intermediate_size", "n_inner", "ffn_dim")
    if ffn is None:
        if not is_int(hidden):
            raise ModelConfigError(f"{name}: hidden size must be an integer, got {hidden!r}")
        ffn = 4 * hidden
    act_name = str(_get(d, "hidden_act", "activation_function", default="gelu_new" if gpt2_style else "silu"))
    if act_name not in _ACT_NAMES:
        raise ModelConfigError(f"{name}: activation {act_name!r} is not modelled; known: {', '.join(_ACT_NAMES)}")
    activation = _ACT_NAMES[act_name]
    gated = not gpt2_style and (kind in GATED_TYPES or activation == "silu")
    dropout = any(isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool) and d[k] > 0 for k in
                  ("resid_pdrop", "attn_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout", "dropout"))
    tied_default = gpt2_style  # transformers' GPT-2 ties by default, Llama does not
    config = ModelConfig(
        name=str(d.get("_name_or_path") or kind or name), layers=layers, hidden=hidden, ffn=ffn, heads=heads,
        vocab=vocab, kv_heads=_get(d, "num_key_value_heads", "n_head_kv", default=heads),
        head_dim=_get(d, "head_dim") if not gpt2_style else None, gated=gated,
        tied=bool(_get(d, "tie_word_embeddings", default=tied_default)),
        norm="layernorm" if gpt2_style else "rmsnorm",
        bias=True if gpt2_style else bool(_get(d, "attention_bias", "mlp_bias", default=False)),
        positions=_get(d, "n_positions", "max_position_embeddings", default=0) if gpt2_style else 0,
        activation=activation, dropout=dropout)
    if config.head_dim is not None and config.head_dim * config.heads == config.hidden:
        config = replace(config, head_dim=None)
    return config.check()


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face `config.json` (ModelConfigError for an unreadable or unusable file)."""
    data = read_document(path, "model config", ModelConfigError, MAX_CONFIG_BYTES, toml=False)
    return from_hf_dict(data, str(path))
