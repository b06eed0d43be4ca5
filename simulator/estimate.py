"""Costs of a cluster you do not have: a cost file estimated from a model description
(`simulator.model_config`) and a GPU description (`simulator.hardware`).

For one transformer layer, the embedding (first stage) and the final norm + LM head +
cross-entropy (last stage), per tensor-parallel rank and microbatch:

- F, B (input gradient), W (weight gradient) and R (recompute forward) in seconds. Each
  GEMM group (QKV, attention output projection, MLP in, MLP out, LM head) takes the
  roofline max(FLOPs / (peak x efficiency), bytes / HBM bandwidth); forward, input
  gradient and weight gradient each do 2 M K N FLOPs. Attention's quadratic part does
  4 b s^2 h FLOPs forward (Narayanan et al. 2021, eq. 2's attention term), half of it
  under a causal mask where kernels skip the masked blocks (FlashAttention, Dao 2023), and
  2.5x that backward with FlashAttention (it recomputes QK^T), 2x without. Norms,
  activations, residual adds, rotary embeddings and the loss are memory-bound: bytes
  moved / (HBM bandwidth x memory_efficiency), twice as many bytes backward. Tensor parallelism (Megatron-LM,
  Shoeybi et al. 2019) adds two all-reduces of the s b h activation to F and two to B;
  with sequence parallelism (Korthikanti et al. 2022) each becomes a reduce-scatter
  plus an all-gather, and W all-gathers the inputs of its two column-parallel GEMMs
  again. Collectives are timed as rings on the link inside a node and never overlap
  compute.
- Memory: `activation_memory`, what F saves for the backward, tensor by tensor; for
  fp16 attention without FlashAttention (the softmax and dropout stored) it is
  Korthikanti et al.'s s b h (34 + 5 a s / h) bytes (/t with TP and SP; without SP
  s b h (10 + 24/t + 5 a s / (h t))); selective recomputation drops the 5 a s / h term,
  full recomputation keeps only the layer input. `weight_memory`, what B leaves for W:
  every weight GEMM's input and the output gradient B captured for it (the norms' too).
  `activation_bytes`: the s b h activation sent at a stage boundary (/t with SP).
  `param_bytes`: parameters + gradients + Adam states, mixed precision 2 + 2 (4 with
  fp32 gradients) + 12 bytes a parameter (Rajbhandari et al. 2020, ZeRO), the 12 divided
  by the data-parallel degree with ZeRO-1; fp32 training 4 + 4 + 8.

Recomputation happens inside each layer's backward (as Megatron-LM does it): R is part
of the layer's B in the cost file, and the memory is what is kept meanwhile. The cost file
is an ordinary `pipesched.costs/1` file with a `layers` section (`simulator.layers`), so
every command reads it and `--partition` splits it.

Units: seconds, bytes, bytes/s, FLOP/s. Bad input is an `EstimateError` (a ValueError)
naming the option and its bound.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pipesched.schedules.numbers import is_int

from .costs import CostModel, DataParallel, Link, Network, StageCost
from .hardware import DTYPES, Hardware
from .layers import LayerCosts
from .model_config import ModelConfig

__all__ = ["Setup", "Work", "Piece", "Estimate", "EstimateError", "estimate", "DTYPE_BYTES", "RECOMPUTE",
           "KERNELS", "ATTENTION", "allreduce_time", "gather_time"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE = ("none", "selective", "full")
KERNELS = ("fused", "eager")      # fused: Megatron/Transformer-Engine kernels; eager: PyTorch ops as written
ATTENTION = ("flash", "math")     # flash: FlashAttention / SDPA (no s x s scores stored); math: scores stored

CAUSAL_SHARE = 0.5          # share of QK^T and AV a causal FlashAttention kernel computes
FLASH_BACKWARD = 2.5        # FlashAttention backward FLOPs / forward (5 matmuls against 2; Dao 2023)
MATH_BACKWARD = 2.0         # attention backward FLOPs / forward without recomputing QK^T
ELEMENTWISE_BACKWARD = 2.0  # bytes a memory-bound op moves backward / forward (reads dy and its input)
# elementwise passes (reads + writes of a tensor) of the activation forward, and what it saves (in tensors)
_ACT_PASSES = {"gelu": 2, "gelu_tanh": 2, "silu": 2, "relu": 2, "gelu_new": 18}
_ACT_SAVED_EAGER = {"gelu": 1, "gelu_tanh": 1, "silu": 1, "relu": 1, "gelu_new": 4}

MAX_SEQ = 1 << 24
MAX_MICROBATCH = 1 << 20
MAX_TP = 1024
MAX_DP = 1_000_000
MAX_BYTES = 2.0 ** 50   # bytes one rank would hold (1 PiB): beyond any machine


class EstimateError(ValueError):
    """Options the estimate cannot use; the message names the option and its bound."""


@dataclass(frozen=True)
class Setup:
    """How the model is trained: `seq` tokens per sequence, `microbatch_size` sequences
    per microbatch, `dtype` of weights and activations, tensor-parallel degree `tp` with
    or without sequence parallelism `sp`, `recompute` none|selective|full, `dp`
    data-parallel replicas, `zero` 1 to shard optimizer states over them, `fp32_grads`
    (gradients kept in fp32 under bf16/fp16), `kernels` fused|eager and `attention`
    flash|math (see KERNELS, ATTENTION)."""

    seq: int
    microbatch_size: int = 1
    dtype: str = "bf16"
    tp: int = 1
    sp: bool = False
    recompute: str = "none"
    dp: int = 1
    zero: int = 0
    fp32_grads: bool = False
    kernels: str = "fused"
    attention: str = "flash"

    def check(self, model: ModelConfig | None = None, hw: Hardware | None = None) -> "Setup":
        for name, flag, bound in (("seq", "--seq", MAX_SEQ), ("microbatch_size", "--microbatch-size", MAX_MICROBATCH),
                                  ("tp", "--tp", MAX_TP), ("dp", "--dp", MAX_DP)):
            value = getattr(self, name)
            if not is_int(value) or not 1 <= value <= bound:
                raise EstimateError(f"{flag} must be an integer in 1..{bound:,}, got {value!r}")
        for name, flag, choices in (("dtype", "--dtype", DTYPES), ("recompute", "--recompute", RECOMPUTE),
                                    ("kernels", "--kernels", KERNELS), ("attention", "--attention", ATTENTION)):
            if getattr(self, name) not in choices:
                raise EstimateError(f"{flag} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name in ("sp", "fp32_grads"):
            if not isinstance(getattr(self, name), bool):
                raise EstimateError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.zero not in (0, 1):
            raise EstimateError(f"--zero must be 0 or 1 (ZeRO-1: optimizer states sharded over --dp), got {self.zero!r}")
        if self.zero and self.dp == 1:
            raise EstimateError("--zero 1 shards optimizer states over the data-parallel replicas; give --dp > 1")
        if self.sp and self.tp == 1:
            raise EstimateError("--sp (sequence parallelism) splits activations over tensor-parallel ranks; "
                                "give --tp > 1")
        if model is not None:
            for what, n in (("attention heads", model.heads), ("key/value heads", model.kv_heads),
                            ("MLP width", model.ffn)):
                if n % self.tp:
                    raise EstimateError(f"--tp {self.tp} does not divide {model.name}'s {what} ({n})")
            if model.positions and self.seq > model.positions:
                raise EstimateError(f"--seq {self.seq} exceeds {model.name}'s {model.positions} learned positions")
        if hw is not None and self.tp > hw.ranks_per_node:
            raise EstimateError(f"--tp {self.tp} spans nodes ({hw.ranks_per_node} GPUs a node): tensor parallelism "
                                "across nodes is not modelled")
        return self

    @property
    def tokens(self) -> int:
        return self.seq * self.microbatch_size


def allreduce_time(nbytes: float, t: int, link: Link) -> float:
    """A ring all-reduce of `nbytes` over t ranks (`DataParallel.allreduce_time`'s ring)."""
    return DataParallel(t, link.latency, link.bandwidth).allreduce_time(nbytes)


def gather_time(nbytes: float, t: int, link: Link) -> float:
    """A ring all-gather or reduce-scatter of `nbytes` (the whole tensor) over t ranks."""
    return 0.0 if t == 1 else (t - 1) * link.latency + (t - 1) / t * nbytes / link.bandwidth


@dataclass
class Work:
    """One op kind of one piece: seconds by category (gemm, attention, elementwise,
    tp_comm) and the FLOPs and HBM bytes behind them."""

    seconds: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    bytes: float = 0.0

    def add(self, category: str, seconds: float, flops: float = 0.0, nbytes: float = 0.0) -> None:
        self.seconds[category] = self.seconds.get(category, 0.0) + seconds
        self.flops += flops
        self.bytes += nbytes

    @property
    def total(self) -> float:
        return math.fsum(self.seconds.values())


@dataclass(frozen=True)
class Piece:
    """One transformer layer, the embedding or the head, per tensor-parallel rank and
    microbatch. `saved`: the tensors F keeps for the backward (bytes each, before
    recomputation); `activation_memory`: what F keeps under the setup's recomputation."""

    name: str
    forward: Work
    backward_input: Work
    backward_weight: Work
    recompute: float
    saved: dict[str, float]
    activation_memory: float
    weight_memory: float
    activation_bytes: float
    params: float
    param_bytes: float
    grad_bytes: float

    def stage_cost(self, recompute_in_backward: bool) -> StageCost:
        """The piece as a layer of a cost file's layers section; with recomputation inside
        the layer's backward, R is part of B."""
        b = self.backward_input.total + (self.recompute if recompute_in_backward else 0.0)
        return StageCost(forward=self.forward.total, backward_input=b, backward_weight=self.backward_weight.total,
                         activation_bytes=self.activation_bytes, activation_memory=self.activation_memory,
                         weight_memory=self.weight_memory, param_bytes=self.param_bytes)

    def summary(self) -> dict:
        return {"forward": self.forward.total, "backward_input": self.backward_input.total,
                "backward_weight": self.backward_weight.total, "recompute": self.recompute,
                "forward_flops": self.forward.flops, "backward_input_flops": self.backward_input.flops,
                "backward_weight_flops": self.backward_weight.flops,
                "seconds_by_kind": {op: dict(w.seconds) for op, w in (("F", self.forward), ("B", self.backward_input),
                                                                       ("W", self.backward_weight))},
                "saved": dict(self.saved), "activation_memory": self.activation_memory,
                "weight_memory": self.weight_memory, "activation_bytes": self.activation_bytes,
                "params_per_rank": self.params, "param_bytes": self.param_bytes}


class _Ops:
    """The estimate's arithmetic for one model, setup and hardware."""

    def __init__(self, model: ModelConfig, setup: Setup, hw: Hardware):
        self.m, self.st, self.hw = model, setup, hw
        self.e = DTYPE_BYTES[setup.dtype]
        self.g = 4 if setup.fp32_grads or setup.dtype == "fp32" else 2
        self.T = setup.tokens
        self.t = setup.tp
        self.u = setup.tp if setup.sp else 1   # activations outside the TP regions are split with SP
        self.rate = hw.gpu.flops(setup.dtype)
        self.bw = hw.gpu.hbm_bandwidth
        self.memory_rate = hw.gpu.memory_rate
        self.link = hw.intra
        self.fused = setup.kernels == "fused"
        self.flash = setup.attention == "flash"

    # --- time ----------------------------------------------------------------------
    def gemm(self, work: Work, flops: float, nbytes: float, category: str = "gemm") -> None:
        work.add(category, max(flops / self.rate, nbytes / self.bw), flops, nbytes)

    def memory_bound(self, work: Work, nbytes: float) -> None:
        work.add("elementwise", nbytes / self.memory_rate, 0.0, nbytes)

    def comm(self, work: Work, kind: str, nbytes: float, count: int = 1) -> None:
        if self.t == 1:
            return
        one = allreduce_time(nbytes, self.t, self.link) if kind == "allreduce" else gather_time(nbytes, self.t, self.link)
        work.add("tp_comm", count * one)

    def weight_gemm(self, f: Work, b: Work, w: Work, k: float, n: float, *, input_grad: bool = True) -> None:
        """Y (T x n) = X (T x k) W (k x n): F, its input gradient on B, its weight gradient on W."""
        T, e, g = self.T, self.e, self.g
        flops = 2 * T * k * n
        self.gemm(f, flops, e * (T * k + k * n + T * n))
        if input_grad:
            self.gemm(b, flops, e * (T * n + k * n + T * k))
        self.gemm(w, flops, e * (T * k + T * n) + 2 * g * k * n)

    # --- norms ------------------------------------------------------------------------
    def norm_saved(self) -> float:
        """Bytes one norm saves (its input, statistics; HF's eager RMSNorm an fp32 copy too)."""
        T, h, e, u = self.T, self.m.hidden, self.e, self.u
        if self.m.norm == "layernorm":
            return e * T * h / u + 8 * T / u
        if self.fused:
            return e * T * h / u + 4 * T / u
        return (4 * T * h + (e * T * h if e != 4 else 4 * T * h)) / u + 4 * T / u

    def norm_traffic(self) -> float:
        """Bytes one norm moves forward."""
        T, h, e, u = self.T, self.m.hidden, self.e, self.u
        if self.m.norm == "layernorm" or self.fused:
            return 2 * e * T * h / u
        convert = 0 if e == 4 else (e + 4) + (4 + e)
        return (convert + 8 + 4 + 8 + 2 * e) * T * h / u  # to fp32, pow, mean, x * rsqrt, to dtype, * weight

    # --- pieces -----------------------------------------------------------------------
    def layer(self) -> Piece:
        m, st = self.m, self.st
        T, e, t, u = self.T, self.e, self.t, self.u
        b, s = st.microbatch_size, st.seq
        h, hq, hkv, f = m.hidden, m.q_width, m.kv_width, m.ffn
        heads = m.heads / t
        F, B, W, R = Work(), Work(), Work(), Work()
        # the weight GEMMs, column-parallel (split by output) or row-parallel (by input)
        for _, k_in, n_out, column in m.layer_matrices():
            k, n = (k_in, n_out / t) if column else (k_in / t, n_out)
            self.weight_gemm(F, B, W, k, n)
            if m.bias:
                self.memory_bound(W, e * T * n)  # bias gradient: a sum over tokens
        # attention's quadratic part: QK^T and AV (and their backward)
        share = CAUSAL_SHARE if self.flash else 1.0
        attn_flops = 4 * b * s * s * hq / t * share
        qkvo = e * T * (2 * hq + 2 * hkv) / t
        scores = b * heads * s * s
        if self.flash:
            attn_bytes, back_bytes = qkvo + 4 * b * heads * s, 2 * qkvo
            back = FLASH_BACKWARD
        else:
            attn_bytes, back_bytes = qkvo + 4 * e * scores, 2 * qkvo + 6 * e * scores
            back = MATH_BACKWARD
        self.gemm(F, attn_flops, attn_bytes, "attention")
        self.gemm(R, attn_flops, attn_bytes, "attention")   # what selective recomputation re-runs
        self.gemm(B, back * attn_flops, back_bytes, "attention")
        # memory-bound work: two norms, rotary embeddings, two residual adds, the activation
        act = m.activation
        rope = 0.0
        if m.rope:
            rope = (2 if self.fused else 10) * e * T * (hq + hkv) / t
        if m.gated:
            act_traffic = (3 if self.fused else _ACT_PASSES[act] + 3) * e * T * f / t
        else:
            act_traffic = (2 if self.fused else _ACT_PASSES[act]) * e * T * f / t
        residual = 3 * e * T * h / u + (T * h / u if m.dropout else 0.0)
        forward_bytes = 2 * self.norm_traffic() + rope + 2 * residual + act_traffic
        self.memory_bound(F, forward_bytes)
        self.memory_bound(B, ELEMENTWISE_BACKWARD * forward_bytes)
        self.memory_bound(W, 2 * (2 * e * T * h / u))   # the norms' weight gradients: x-hat and dy
        # tensor parallelism: activations all-reduced (or reduce-scattered and all-gathered)
        full = e * T * h
        if st.sp:
            self.comm(F, "gather", full, 4)   # 2 all-gathers + 2 reduce-scatters
            self.comm(B, "gather", full, 4)
            self.comm(W, "gather", full, 2)   # the column-parallel GEMMs' inputs, gathered again
        else:
            self.comm(F, "allreduce", full, 2)
            self.comm(B, "allreduce", full, 2)

        saved = self.layer_saved()
        if st.recompute == "full":
            kept = e * T * h / u
            recompute = F.total
        elif st.recompute == "selective":
            kept = sum(v for k, v in saved.items() if k not in ("scores", "attention_dropout"))
            recompute = 0.0 if self.flash else R.total
        else:
            kept, recompute = sum(saved.values()), 0.0
        weight_memory = self.layer_weight_memory()
        params = self.layer_params_per_rank()
        return Piece("layer", F, B, W, recompute, saved, kept, weight_memory, e * T * h / u, params,
                     params * self.bytes_per_param(), params * self.g)

    def layer_saved(self) -> dict[str, float]:
        """What F saves for the backward, tensor by tensor (bytes; see the module docstring)."""
        m, st = self.m, self.st
        T, e, t, u = self.T, self.e, self.t, self.u
        b, s = st.microbatch_size, st.seq
        h, hq, hkv, f = m.hidden, m.q_width, m.kv_width, m.ffn
        heads = m.heads / t
        saved = {"norm1": self.norm_saved(), "qkv_input": e * T * h / u, "q_k_v": e * T * (hq + 2 * hkv) / t}
        if self.flash:
            saved["attention_output"] = e * T * hq / t            # also the projection's input
            saved["softmax_stats"] = 4 * b * heads * s
        else:
            saved["scores"] = e * b * heads * s * s                # the softmax output
            if m.dropout:
                saved["attention_dropout"] = (1 + e) * b * heads * s * s  # mask and dropped-out scores
            saved["proj_input"] = e * T * hq / t
        if m.rope and not self.fused:
            saved["rope_tables"] = 2 * e * s * m.dim_head         # cos and sin
        if m.dropout:
            saved["dropout_masks"] = 2 * T * h / u
        saved["norm2"] = self.norm_saved()
        saved["mlp_input"] = e * T * h / u
        if m.gated:
            saved["mlp_hidden"] = (2 if self.fused else 3) * e * T * f / t  # gate and up outputs (+ SiLU's)
        else:
            saved["mlp_hidden"] = (1 if self.fused else _ACT_SAVED_EAGER[m.activation]) * e * T * f / t
        saved["mlp_out_input"] = e * T * f / t
        return saved

    def layer_weight_memory(self) -> float:
        """What B leaves for W: each weight GEMM's input and the output gradient B captured
        for it, and each norm's input and output gradient."""
        m = self.m
        T, e, t, u = self.T, self.e, self.t, self.u
        total = 0.0
        for _, k_in, n_out, column in m.layer_matrices():
            if column:
                total += e * T * k_in / u + e * T * n_out / t
            else:
                total += e * T * k_in / t + e * T * n_out
        return total + 2 * (2 * e * T * m.hidden / u)

    def layer_params_per_rank(self) -> float:
        m, t = self.m, self.t
        n = sum(i * o for _, i, o, _ in m.layer_matrices()) / t + 2 * m.norm_params()
        if m.bias:
            n += sum(o / t if column else o for _, _, o, column in m.layer_matrices())
        return n

    def bytes_per_param(self) -> float:
        """Weights + gradients + optimizer states per parameter (Adam; mixed precision keeps
        an fp32 master copy), the states divided over dp with ZeRO-1."""
        st = self.st
        optimizer = 8.0 if st.dtype == "fp32" else 12.0
        if st.zero:
            optimizer /= st.dp
        return self.e + self.g + optimizer

    def embedding(self) -> Piece:
        m, st = self.m, self.st
        T, e, g, t, u = self.T, self.e, self.g, self.t, self.u
        h = m.hidden
        F, B, W = Work(), Work(), Work()
        traffic = 2 * e * T * h + (3 * e * T * h if m.positions else 0.0)  # gather rows (+ add positions)
        self.memory_bound(F, traffic)
        self.memory_bound(W, (e + 2 * g) * T * h + (e * T * h if m.positions else 0.0))  # scatter-add the gradient
        if st.sp:
            self.comm(F, "gather", e * T * h)   # vocab-parallel: reduce-scatter the partial embeddings
            self.comm(W, "gather", e * T * h)   # all-gather the output gradient
        else:
            self.comm(F, "allreduce", e * T * h)
        params = math.ceil(m.vocab / t) * h + m.positions * h
        saved = {"token_ids": 8.0 * T}
        return Piece("embedding", F, B, W, 0.0, saved, 8.0 * T, 8.0 * T + e * T * h, e * T * h / u, params,
                     params * self.bytes_per_param(), params * self.g)

    def head(self) -> Piece:
        m, st = self.m, self.st
        T, e, t, u = self.T, self.e, self.t, self.u
        h = m.hidden
        v = math.ceil(m.vocab / t)
        F, B, W = Work(), Work(), Work()
        self.memory_bound(F, self.norm_traffic())
        self.memory_bound(B, ELEMENTWISE_BACKWARD * self.norm_traffic())
        self.memory_bound(W, 2 * e * T * h / u)
        self.weight_gemm(F, B, W, h, v)
        logit_bytes = 4 if self.fused else e   # Megatron's cross-entropy works in fp32
        if self.fused:
            self.memory_bound(F, (e + 8) * T * v)     # read logits, write fp32 softmax, one more pass
            self.memory_bound(B, (4 + e) * T * v)     # read softmax, write the logits' gradient
        else:
            self.memory_bound(F, 3 * e * T * v)       # log_softmax: max, sum of exp, write
            self.memory_bound(B, 4 * e * T * v)       # nll's dense gradient, log_softmax's backward
        if st.sp:
            self.comm(F, "gather", e * T * h)
            self.comm(B, "gather", e * T * h)
            self.comm(W, "gather", e * T * h)
        else:
            self.comm(B, "allreduce", e * T * h)
        if t > 1:
            self.comm(F, "allreduce", 4.0 * T, 3)     # vocab-parallel cross-entropy: max, sum, target logit
        saved = {"norm": self.norm_saved(), "head_input": e * T * h / u, "logits": logit_bytes * T * v}
        weight_memory = e * T * h / u + e * T * v + 2 * e * T * h / u
        params = v * h + m.norm_params()   # a tied head keeps its own copy of the embedding on the last stage
        return Piece("head", F, B, W, 0.0, saved, sum(saved.values()), weight_memory, 0.0, params,
                     params * self.bytes_per_param(), params * self.g)


@dataclass(frozen=True)
class Estimate:
    """The estimate of one model, setup and hardware: per-layer, embedding and head
    costs, and the network and data-parallel links of the placement (TP fastest, then DP,
    then PP, as Megatron-LM orders ranks)."""

    model: ModelConfig
    setup: Setup
    hardware: Hardware
    layer: Piece
    embedding: Piece
    head: Piece
    network: Network
    data_parallel: DataParallel
    dp_bandwidth_scale: float

    def layer_costs(self) -> LayerCosts:
        inside = self.setup.recompute != "none"
        layer = self.layer.stage_cost(inside)
        return LayerCosts((layer,) * self.model.layers, self.embedding.stage_cost(False), self.head.stage_cost(False),
                          "balanced", "fbw").check()

    def cost_model(self) -> CostModel:
        return CostModel(network=self.network, data_parallel=self.data_parallel, layers=self.layer_costs(),
                         meta={"estimate": self.meta()}).check()

    def meta(self) -> dict:
        """What the cost file records of how it was estimated."""
        hw = self.hardware
        return {
            "model": asdict(self.model), "setup": asdict(self.setup),
            "hardware": {"gpu": hw.gpu.name, "peak_flops": hw.gpu.peak_flops, "efficiency": hw.gpu.efficiency,
                         "memory_efficiency": hw.gpu.memory_efficiency,
                         "hbm_bandwidth": hw.gpu.hbm_bandwidth, "memory": hw.gpu.memory,
                         "ranks_per_node": hw.ranks_per_node, "source": hw.gpu.source,
                         "intra_node": {"bandwidth": hw.intra.bandwidth, "latency": hw.intra.latency},
                         "inter_node": {"bandwidth": hw.inter.bandwidth, "latency": hw.inter.latency}},
            "layer": self.layer.summary(), "embedding": self.embedding.summary(), "head": self.head.summary(),
            "recompute": ("inside each layer's backward: B includes R" if self.setup.recompute != "none" else "none"),
            "data_parallel_bandwidth_scale": self.dp_bandwidth_scale,
            "note": ("estimated, not measured: per tensor-parallel rank; data_parallel.bandwidth is the link's "
                     "times param_bytes per gradient byte, since a layers section all-reduces param_bytes"),
        }


def placement(setup: Setup, hw: Hardware) -> tuple[Network, Link]:
    """The pipeline's network and the data-parallel link: ranks numbered TP fastest, then
    DP, then PP, so a pipeline stage spans tp x dp GPUs; pipeline neighbours share a node
    when that is under a node."""
    group = setup.tp * setup.dp
    per_node = hw.ranks_per_node
    if group >= per_node or per_node % group:
        network = Network(hw.inter)
    else:
        network = Network(hw.intra, hw.inter, per_node // group)
    dp_link = hw.intra if group <= per_node else hw.inter
    return network, dp_link


def estimate(model: ModelConfig, setup: Setup, hw: Hardware) -> Estimate:
    """The estimate (see the module docstring); EstimateError for unusable options."""
    model.check()
    hw.check()
    setup.check(model, hw)
    ops = _Ops(model, setup, hw)
    layer, embedding, head = ops.layer(), ops.embedding(), ops.head()
    for piece in (layer, embedding, head):
        held = piece.activation_memory + piece.weight_memory + piece.param_bytes * (model.layers + 2)
        if not math.isfinite(held) or held > MAX_BYTES:
            raise EstimateError(f"the estimate holds {held:.3g} bytes a rank ({piece.name}): beyond any machine; "
                                "check --seq, --microbatch-size and the model's sizes")
    network, dp_link = placement(setup, hw)
    scale = ops.bytes_per_param() / ops.g
    dp = DataParallel() if setup.dp == 1 else DataParallel(setup.dp, dp_link.latency, dp_link.bandwidth * scale)
    return Estimate(model, setup, hw, layer, embedding, head, network, dp, scale)
