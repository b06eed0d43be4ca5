"""The cost estimate (`pipesched costs`, `simulator.estimate`) against published A100 times:
the zero-bubble paper's profiled T_F, T_B, T_W. A held-out check: nothing is fitted to it.

Published side: Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024,
arXiv 2401.10241v1), read from the markdown transcription of the v1 PDF in the public code
index (the one `zb_paper.py` uses; front matter: arxiv_id 2401.10241v1, "Converted by Opus
reading rendered PDF pages", tables 1-12 as markdown):
  - Table 9 (Appendix D): T_F, T_B, T_W (ms) per model, p and m, "profiled ... in ZB-2p";
    typed in `zb_paper.ROWS`, reused here;
  - Table 3: layers 22 / 30 / 46 / 62, heads, hidden size (`zb_paper.MODELS`), sequence
    length 1024, p = 8 / 8 / 16 / 32 GPUs, microbatch sizes 6 / 3 / 1 / 1;
  - Section 5.1: Megatron-LM based, "GPT-3 like" models, up to 32 A100 SXM 80G GPUs, and
    "both the initial and final pipeline stages possess one fewer transformer layer
    compared to the intermediate stages", so a middle stage has (layers + 2) / p layers:
    3, 4, 3, 2;
  - Section 2.3 / Table 1: FFN 4h, head dimension h / a; F saves M_B = s b (34h + 5as)
    bytes a layer, B leaves M_W = 32 s b h for W (Korthikanti et al.'s count: 16-bit,
    dropout, attention scores stored).
The paper does not state the precision, attention kernel, dropout, TP or vocabulary. They
are taken from the authors' code at the commit "for arxiv paper" (sail-sg/zero-bubble-
pipeline-parallelism f68d3879, 2023-11-29): examples/pretrain_zero_bubble.sh runs --fp16,
TP 1, seq 1024, --max-position-embeddings 2048, without --use-flash-attn, and with
Megatron's default dropout (attention and hidden 0.1) and --transformer-impl local (the
fused legacy kernels: scaled masked softmax, bias-GeLU, bias-dropout-add); Table 4 has as
many GPUs as stages, so DP 1. Its tokenizer is a SentencePiece model whose size is not
given; the vocabulary only touches the first and last stages, which are not compared, so
GPT-2's 50257 stands in (the parameter counts then come to 1.52, 6.26, 14.7, 28.4 B).
Which stage Table 9 describes: at that commit `zb_schedules.update_schedule` all-gathers
every rank's average F, B, W times and feeds the scheduler the element at len // 2 of each
sorted list, an upper median over the ranks; with 6 of 8 (14 of 16, 30 of 32) ranks
being middle stages, that is a middle stage's time. Its W is what `WeightGradStore`
defers: the linear layers' weight-gradient GEMMs only (bias and LayerNorm gradients stay
in B).

Our side, per row: `estimate()` on `a100-80gb` at the default efficiencies (matmuls 0.75,
memory-bound work 0.3 of the HBM bandwidth: read off an H200, never off these tables), fp16,
TP 1, recompute none, fused kernels, math attention; the model a GPT (LayerNorm, biases,
learned positions, GeLU, dropout, tied embeddings). A middle stage's F, B, W are the
layer's times x its layers. Errors are estimate / published - 1. The efficiency each time
implies (the efficiency at which the estimate equals it, everything else kept) is printed
as information; it does not change the defaults.

Usage: python benchmarks/estimate_vs_published.py
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipesched.simulator.estimate import Estimate, Setup, estimate  # noqa: E402
from pipesched.simulator.hardware import Hardware, hardware  # noqa: E402
from pipesched.simulator.model_config import ModelConfig  # noqa: E402
from zb_paper import MODELS, ROWS, SEQUENCE, Row  # noqa: E402

GPU = "a100-80gb"
LAYERS = {"1.5B": 22, "6.2B": 30, "14.6B": 46, "28.3B": 62}  # Table 3
MICROBATCH = {"1.5B": 6, "6.2B": 3, "14.6B": 1, "28.3B": 1}  # Table 3
VOCAB = 50257  # not stated by the paper (GPT-2's); only the first and last stages use it
POSITIONS = 2048  # --max-position-embeddings in the authors' example script
TARGET_MEDIAN, TARGET_WORST = 0.15, 0.30
OPS = ("F", "B", "W")


def model(name: str) -> ModelConfig:
    """Table 3's model as Megatron-LM's GPT builds it (see the module docstring)."""
    h, a = MODELS[name]
    return ModelConfig(f"zb-{name}", layers=LAYERS[name], hidden=h, ffn=4 * h, heads=a, vocab=VOCAB, tied=True,
                       norm="layernorm", bias=True, positions=POSITIONS, activation="gelu", dropout=True).check()


def setup(name: str) -> Setup:
    """fp16, TP 1, no recomputation, Megatron's fused kernels, attention without FlashAttention."""
    return Setup(seq=SEQUENCE, microbatch_size=MICROBATCH[name], dtype="fp16", tp=1, recompute="none",
                 kernels="fused", attention="math")


def layers_per_stage(row: Row) -> int:
    """A middle stage's layers: the first and last stages have one fewer (Section 5.1)."""
    total = LAYERS[row.model] + 2
    assert total % row.p == 0, (row.model, row.p)
    return total // row.p


class Compared(NamedTuple):
    """One Table 9 row: a middle stage's estimated and published F, B, W in ms, and the
    layer's activation bytes per token against the paper's M_B and M_W."""

    row: Row
    layers: int
    estimate: Estimate
    estimated: tuple[float, float, float]
    published: tuple[float, float, float]
    saved_per_token: float       # estimate's activation_memory / (s b)
    kept_per_token: float        # estimate's weight_memory / (s b)
    paper_saved_per_token: float  # 34h + 5as
    paper_kept_per_token: float   # 32h

    @property
    def errors(self) -> tuple[float, float, float]:
        return tuple(e / p - 1 for e, p in zip(self.estimated, self.published))


def stage_times(est: Estimate, layers: int) -> tuple[float, float, float]:
    """A middle stage's F, B, W in ms: the layer's times x its layers."""
    piece = est.layer
    return tuple(layers * w.total * 1e3 for w in (piece.forward, piece.backward_input, piece.backward_weight))


def compare(row: Row, hw: Hardware | None = None) -> Compared:
    """The estimate for one Table 9 row (on `a100-80gb` at its default efficiencies unless `hw`)."""
    hw = hw if hw is not None else hardware(GPU)
    est = estimate(model(row.model), setup(row.model), hw)
    k = layers_per_stage(row)
    h, a = MODELS[row.model]
    tokens = SEQUENCE * MICROBATCH[row.model]
    return Compared(row, k, est, stage_times(est, k), (row.f, row.b, row.w),
                    est.layer.activation_memory / tokens, est.layer.weight_memory / tokens,
                    34.0 * h + 5.0 * a * SEQUENCE, 32.0 * h)


def with_efficiency(hw: Hardware, efficiency: float) -> Hardware:
    return replace(hw, gpu=replace(hw.gpu, efficiency=efficiency))


def implied_efficiency(row: Row, op: int, hw: Hardware) -> float | None:
    """The efficiency at which the estimated time of op (0 F, 1 B, 2 W) equals the
    published one (bisection; the time falls as efficiency rises); None if even 1.0 is slow."""
    target = (row.f, row.b, row.w)[op]
    k = layers_per_stage(row)

    def time_at(eff: float) -> float:
        return stage_times(estimate(model(row.model), setup(row.model), with_efficiency(hw, eff)), k)[op]

    lo, hi = 0.01, 1.0
    if time_at(hi) > target:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        if time_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def summary(errors: list[float]) -> tuple[float, float]:
    """(median, worst) of |error|."""
    mags = [abs(e) for e in errors]
    return statistics.median(mags), max(mags)


def main() -> None:
    hw = hardware(GPU)
    results = [compare(row, hw) for row in ROWS]
    print(f"{hw.describe()}")
    print(f"fp16, TP 1, DP 1, recompute none, fused kernels, math attention (no FlashAttention), dropout; "
          f"seq {SEQUENCE}; a middle stage of (layers + 2) / p layers; vocabulary {VOCAB} (not used by a middle stage)")
    for name in MODELS:
        m = model(name)
        print(f"  {m.describe()}; microbatch {MICROBATCH[name]}")
    print()
    print("a middle stage, ms: estimated / published (error = estimated / published - 1); implied = the efficiency "
          "at which the estimate equals the published time")
    print(f"{'model':<6}{'p':>3}{'m':>5}{'L/st':>5} | " + " | ".join(f"{op:^37}" for op in OPS))
    print(f"{'':<19} | " + " | ".join(f"{'est':>8} {'pub':>8} {'error':>8} {'implied':>8}" for _ in OPS))
    by_op: dict[str, list[float]] = {op: [] for op in OPS}
    implied: dict[str, list[float]] = {op: [] for op in OPS}
    for r in results:
        cells = []
        for i, op in enumerate(OPS):
            eff = implied_efficiency(r.row, i, hw)
            by_op[op].append(r.errors[i])
            if eff is not None:
                implied[op].append(eff)
            cells.append(f"{r.estimated[i]:8.3f} {r.published[i]:8.3f} {100 * r.errors[i]:+7.1f}% "
                         f"{'>1' if eff is None else f'{eff:.3f}':>8}")
        print(f"{r.row.model:<6}{r.row.p:>3}{r.row.m:>5}{r.layers:>5} | " + " | ".join(cells))
    print()
    print("|error| by op kind (12 rows each; the 3 rows of a model differ only in the published times):")
    everything = [e for op in OPS for e in by_op[op]]
    for label, errs in [*((op, by_op[op]) for op in OPS), ("all", everything)]:
        med, worst = summary(errs)
        eff = f"; implied efficiency median {statistics.median(implied[label]):.3f}" if label in implied else ""
        print(f"  {label:<4} median {100 * med:5.1f} %, worst {100 * worst:5.1f} %; "
              f"mean signed {100 * statistics.fmean(errs):+5.1f} %{eff}")
    med, worst = summary(everything)
    met = med <= TARGET_MEDIAN and worst <= TARGET_WORST
    print(f"  target (median <= {100 * TARGET_MEDIAN:.0f} %, none over {100 * TARGET_WORST:.0f} %): "
          f"{'met' if met else 'NOT met'} (median {100 * med:.1f} %, worst {100 * worst:.1f} %)")
    print()
    print("shape of the costs, estimated / published:")
    print(f"{'model':<6}{'m':>5} | {'T_B/T_F':>15} | {'T_W/T_F':>15} | {'(T_B+T_W)/T_F':>15}")
    for r in results:
        (ef, eb, ew), (pf, pb, pw) = r.estimated, r.published
        print(f"{r.row.model:<6}{r.row.m:>5} | {eb / ef:6.3f} / {pb / pf:6.3f} | {ew / ef:6.3f} / {pw / pf:6.3f} | "
              f"{(eb + ew) / ef:6.3f} / {(pb + pw) / pf:6.3f}")
    print()
    print(f"one matmul efficiency for every op, memory-bound work kept at {hw.gpu.memory_efficiency:g} "
          f"(information only; the default stays {hw.gpu.efficiency:g}): |error| over the 36 times")
    grid = [x / 100 for x in range(30, 101, 5)]
    best = None
    for eff in grid:
        h2 = with_efficiency(hw, eff)
        errs = [e for row in ROWS for e in compare(row, h2).errors]
        med, worst = summary(errs)
        if best is None or med < best[1]:
            best = (eff, med, worst)
        if eff in (0.5, 0.6, 0.7, 0.75, 0.8):
            print(f"  efficiency {eff:.2f}: median {100 * med:5.1f} %, worst {100 * worst:5.1f} %")
    print(f"  lowest median on a 0.05 grid: efficiency {best[0]:.2f}: median {100 * best[1]:.1f} %, "
          f"worst {100 * best[2]:.1f} %")
    print()
    print("activations per layer and token, bytes: estimate / paper (Table 1: 16-bit, no FlashAttention)")
    seen = set()
    for r in results:
        if r.row.model in seen:
            continue
        seen.add(r.row.model)
        print(f"  {r.row.model:<6} F -> B: {r.saved_per_token:9.0f} / 34h+5as = {r.paper_saved_per_token:9.0f} "
              f"({100 * (r.saved_per_token / r.paper_saved_per_token - 1):+.3f} %);  "
              f"B -> W: {r.kept_per_token:7.0f} / 32h = {r.paper_kept_per_token:7.0f} "
              f"({100 * (r.kept_per_token / r.paper_kept_per_token - 1):+.1f} %)")


if __name__ == "__main__":
    main()
