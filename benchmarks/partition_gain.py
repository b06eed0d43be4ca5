"""How much a balanced layer split gains over an even one, in the simulator, for a model
whose LM head (and loss) is heavy: a Llama-3-8B-like model (32 layers, hidden 4096,
FFN 14336, vocabulary 128256), sequence 4096, microbatch 1, bf16 with Adam.

Per-layer times come from FLOPs at an assumed 400 TFLOP/s (B = W = F: two matmuls per
matmul of the forward); the head's F is its 2 * tokens * hidden * vocab FLOPs (about
1.9 layers), the embedding a lookup (0.1 ms). Activations sent: tokens x hidden x 2 B;
stored per layer about 34 x tokens x hidden bytes; the head also stores its fp32 logits.
Parameters (with gradients and Adam state) at 16 bytes each.

For each schedule and p, prints the step time with the layers split evenly (by count)
and balanced (the partitioner minimising the slowest stage's F+B+W), the speed-up
(even / balanced), both splits and the peak memory of the busiest rank. Simulated, so
exact and deterministic: no timing noise.
Usage: python benchmarks/partition_gain.py [--bandwidth 50GB/s] [--microbatches 32]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, Link, Network, StageCost
from pipesched.simulator.layers import LayerCosts
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.units import parse_bandwidth

HIDDEN, FFN, LAYERS, VOCAB, SEQ, MB = 4096, 14336, 32, 128256, 4096, 1
FLOPS = 400e12  # sustained, per GPU
TOKENS = SEQ * MB


def llama_like(bandwidth: float) -> CostModel:
    layer_params = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN
    layer_f = (2 * TOKENS * layer_params + 2 * TOKENS * SEQ * HIDDEN) / FLOPS  # matmuls + causal attention
    head_f = 2 * TOKENS * HIDDEN * VOCAB / FLOPS
    sends = TOKENS * HIDDEN * 2.0
    layer = StageCost(forward=layer_f, backward_input=layer_f, backward_weight=layer_f, activation_bytes=sends,
                      activation_memory=34.0 * TOKENS * HIDDEN, weight_memory=10.0 * TOKENS * HIDDEN,
                      param_bytes=16.0 * layer_params)
    embedding = StageCost(forward=1e-4, backward_input=0.0, backward_weight=2e-4, activation_bytes=sends,
                          activation_memory=0.0, param_bytes=16.0 * VOCAB * HIDDEN)
    head = StageCost(forward=head_f, backward_input=head_f, backward_weight=head_f,
                     activation_memory=2.0 * TOKENS * HIDDEN + 4.0 * TOKENS * VOCAB,
                     weight_memory=2.0 * TOKENS * HIDDEN, param_bytes=16.0 * VOCAB * HIDDEN)
    layers = LayerCosts((layer,) * LAYERS, embedding, head)
    return CostModel(layers=layers, network=Network(Link(5e-6, bandwidth))).check()


def step(costs: CostModel, name: str, p: int, m: int) -> tuple[float, float]:
    graph = validate(build(name, p, m))
    metrics = compute_metrics(simulate(graph, costs), graph)
    return metrics.makespan, max(r.peak_memory_bytes for r in metrics.per_rank)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidth", default="50GB/s")
    ap.add_argument("--microbatches", type=int, default=32)
    args = ap.parse_args()
    base = llama_like(parse_bandwidth(args.bandwidth))
    m = args.microbatches
    print(f"Llama-3-8B-like, {LAYERS} layers, head = {base.layers.weights()[2] / base.layers.weights()[0][0]:.2f} "
          f"layers of F+B+W, m = {m}, {args.bandwidth}")
    print(f"{'schedule':<18} {'p':>2}  {'even step':>10}  {'balanced':>10}  {'speed-up':>8}  "
          f"{'peak GiB even/bal':>17}  splits (even | balanced)")
    for name, p in (("1f1b", 4), ("1f1b", 8), ("interleaved-1f1b", 4), ("zb-h1", 4), ("zb-h1", 8),
                    ("zb-v", 4), ("dualpipev", 4)):
        schedule = build(name, p, m)
        s = schedule.num_model_stages
        result = {}
        for how in ("even", "balanced"):
            costs = replace(base, layers=replace(base.layers, partition=how))
            result[how] = (*step(costs, name, p, m), costs.layers.split(s))
        (t_even, mem_even, split_even), (t_bal, mem_bal, split_bal) = result["even"], result["balanced"]
        print(f"{name:<18} {p:>2}  {t_even:>9.3f}s  {t_bal:>9.3f}s  {t_even / t_bal:>7.3f}x  "
              f"{mem_even / 2 ** 30:>8.1f}/{mem_bal / 2 ** 30:<8.1f}  "
              f"{','.join(map(str, split_even))} | {','.join(map(str, split_bal))}")
    # the objective: F+B (zero-bubble schedules defer W into bubbles) against F+B+W
    print("objective for zb-h1, p = 4: ", end="")
    for objective in ("fbw", "fb"):
        costs = replace(base, layers=replace(base.layers, objective=objective))
        t, _ = step(costs, "zb-h1", 4, m)
        print(f"{objective} {t:.4f} s ({','.join(map(str, costs.layers.split(4)))})  ", end="")
    print()


if __name__ == "__main__":
    main()
