"""The cost estimate (`pipesched costs`, `simulator.estimate`) against what runs on this CPU.

The estimator is given a CPU "GPU kind": its peak is the matmul rate measured here in
one thread (torch.matmul over the GEMM shapes of the models below: forward, input- and
weight-gradient products; total FLOPs over total time, efficiency 1), its memory
bandwidth a streaming add measured at the models' activation sizes. Nothing else is
fitted. Each model is described to the estimator as the executor builds it
(`executor.models.TransformerBlock`: LayerNorm, biases, 4h GELU MLP, heads of 32;
`executor.hf_models`: transformers' Llama and GPT-2 read back through their config.json,
eager PyTorch ops, SDPA attention), fp32, and compared with:

1. op times: `pipesched calibrate 1f1b -p 2 -m 2 --op-times solo` (each op profiled with
   the other rank idle, one thread per rank; two blocks per model stage, the hf-* models
   with the embedding on stage 0 and the head + loss on stage 1): F, B and W of stage 1
   (the example transformer's stage 1 also computes the MSE loss, which the estimate
   leaves out); F and B + W of stage 0, whose B has no input gradient to compute (the
   input is data), so all of its backward is measured as W.
2. saved activations: what autograd saves for one layer (and the hf-* embedding and
   head + loss), counted with torch.autograd.graph.saved_tensors_hooks as the sum of
   the unique storages' bytes (parameters excluded), against the estimate's
   activation_memory.

Prints a table per model and the error per op kind (median and worst of |estimate /
measured - 1|). About 6-8 minutes (five calibrations); `--measure cpu-time` profiles
the stages in this process with the code calibrate's solo mode uses, timed in thread CPU
seconds (about a minute; on this shared 2-core machine other jobs' load inflates wall-clock
times, which CPU time leaves out; `both`, the default, prints the two side by side).
Usage: python benchmarks/estimate_vs_measured.py [--models transformer-128,hf-llama] [--measure both|calibrate|cpu-time]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import torch
from torch.autograd.graph import saved_tensors_hooks

from pipesched.simulator.costs import Link
from pipesched.simulator.estimate import Setup, estimate
from pipesched.simulator.hardware import GpuKind, Hardware
from pipesched.simulator.model_config import ModelConfig, from_hf_dict

SEQ = 128
# name: (--model, hidden, microbatch size); sequences of SEQ tokens, vocabulary 4096 for hf-*
MODELS = {
    "transformer-128": ("transformer", 128, 8),
    "transformer-256": ("transformer", 256, 4),
    "transformer-512": ("transformer", 512, 2),
    "hf-llama": ("hf-llama", 256, 4),
    "hf-gpt2": ("hf-gpt2", 256, 4),
}
VOCAB = 4096
BLOCKS = 2  # per model stage
RANKS = 2


def model_config(kind: str, hidden: int) -> ModelConfig:
    """The estimator's description of the model the executor builds."""
    if kind == "transformer":
        return ModelConfig("transformer", layers=RANKS * BLOCKS, hidden=hidden, ffn=4 * hidden, heads=hidden // 32,
                           vocab=1, bias=True, norm="layernorm", activation="gelu").check()
    from pipesched.executor.hf_models import HFModel
    lm = HFModel(kind, hidden=hidden, seq=SEQ, microbatch_size=1, vocab=VOCAB).causal_lm(RANKS * BLOCKS)
    return from_hf_dict(json.loads(lm.config.to_json_string()), kind)


# --- the CPU's figures -------------------------------------------------------------

def _median_seconds(fn, repeats: int = 9) -> float:
    """Median thread CPU seconds of `fn` (CPU time: what it costs with a core to itself,
    however busy this shared machine is)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def gemm_shapes(config: ModelConfig, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of every weight GEMM of one layer (and the LM head where there is one)."""
    shapes = [(tokens, k, n) for _, k, n, _ in config.layer_matrices()]
    if config.vocab > 1:
        shapes.append((tokens, config.hidden, config.vocab))
    return shapes


def measured_gemm_rate(shapes: list[tuple[int, int, int]]) -> float:
    """FLOP/s of torch.matmul in one thread over the shapes: X W, dY W^T and X^T dY each,
    cycling through four copies of the operands so that they do not stay in the caches
    (in a model, each GEMM meets its operands once)."""
    flops = seconds = 0.0
    for m, k, n in shapes:
        copies = [(torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)) for _ in range(4)]
        for product in (lambda x, w, dy: x @ w, lambda x, w, dy: dy @ w.t(), lambda x, w, dy: x.t() @ dy):
            turn = iter(range(1 << 30))
            seconds += _median_seconds(lambda: product(*copies[next(turn) % 4]))
            flops += 2.0 * m * k * n
    return flops / seconds


# the memory-bound ops transformer layers run: (op on a (tokens, width) tensor, tensors it reads + writes)
_MEMORY_BOUND = {
    "add": (lambda a, b: a + b, 3), "mul": (lambda a, b: a * b, 3), "pow": (lambda a, b: a.pow(3), 2),
    "tanh": (lambda a, b: torch.tanh(a), 2), "gelu": (lambda a, b: torch.nn.functional.gelu(a), 2),
    "silu": (lambda a, b: torch.nn.functional.silu(a), 2),
    "layer_norm": (lambda a, b: torch.nn.functional.layer_norm(a, a.shape[-1:]), 2),
    "softmax": (lambda a, b: torch.softmax(a, -1), 2),
}


def measured_bandwidth(shapes: list[tuple[int, int]], which: tuple[str, ...] = tuple(_MEMORY_BOUND)) -> float:
    """Bytes/s the memory-bound ops of a transformer layer move on this CPU in one thread
    (`_MEMORY_BOUND`, one call of each at each (tokens, width)): on a GPU these run at
    the HBM bandwidth; on a CPU core most are bound by their arithmetic instead, so the
    rate they reach is this machine's figure. `which=("add",)`: a streaming add alone."""
    moved = seconds = 0.0
    for rows, width in shapes:
        a, b = torch.randn(rows, width), torch.randn(rows, width)
        for name in which:
            op, tensors = _MEMORY_BOUND[name]
            seconds += _median_seconds(lambda: op(a, b))
            moved += 4.0 * tensors * rows * width
    return moved / seconds


def cpu_hardware(rate: float, bandwidth: float) -> Hardware:
    gpu = GpuKind("cpu-1-thread", {"fp32": rate, "bf16": rate, "fp16": rate}, bandwidth, 2.0 ** 36, 1.0,
                  "measured here: torch.matmul and torch.add in one thread", memory_efficiency=1.0)
    return Hardware(gpu, Link(0.0, 1e12), Link(0.0, 1e12), 8).check()


# --- measurements --------------------------------------------------------------------

def calibrated_stages(kind: str, hidden: int, mbs: int, folder: str) -> list[dict]:
    """Per model stage F, B, W from `pipesched calibrate` (solo op times)."""
    out = os.path.join(folder, f"{kind}-{hidden}.json")
    cmd = [sys.executable, "-m", "pipesched", "calibrate", "1f1b", "-p", str(RANKS), "-m", "2", "--model", kind,
           "--hidden", str(hidden), "--seq", str(SEQ), "--microbatch-size", str(mbs), "--layers-per-stage",
           str(BLOCKS), "--op-times", "solo", "--repeats", "7", "--calibration-warmup", "2", "-o", out]
    if kind.startswith("hf-"):
        cmd += ["--vocab", str(VOCAB)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    with open(out) as f:
        return json.load(f)["model_stages"]


def profiled_stages(kind: str, hidden: int, mbs: int) -> list[dict]:
    """The same op times profiled in this process, one thread, by the code calibrate's solo
    profile runs (`executor.profile.profile_stage`), timed in thread CPU seconds."""
    from pipesched.executor import profile
    from pipesched.executor.clock import CpuTimer
    from pipesched.executor.hf_models import HFModel
    from pipesched.executor.models import ExampleModel, check_model
    from pipesched.executor.profile import profile_stage, stage_for_profiling

    class ThreadTimer(CpuTimer):
        def mark(self) -> float:
            return time.thread_time()

    profile._timer = lambda device: ThreadTimer()

    if kind == "transformer":
        spec = ExampleModel(kind, hidden=hidden, layers_per_stage=BLOCKS, microbatch_size=mbs, seq=SEQ)
    else:
        spec = HFModel(kind, hidden=hidden, layers_per_stage=BLOCKS, microbatch_size=mbs, seq=SEQ, vocab=VOCAB)
    model = spec.build(RANKS, 2)
    specs = check_model(model, RANKS, 2)
    out = []
    for k in range(RANKS):
        sm, x, target, grad = stage_for_profiling(model, specs, k, torch.device("cpu"))
        prof = profile_stage(sm, x, target, grad, torch.device("cpu"), repeats=7, warmup=2)
        out.append({"forward": prof.forward, "backward_input": prof.backward_input,
                    "backward_weight": prof.backward_weight})
    return out


def saved_bytes(fn, params) -> int:
    """Bytes of the unique storages autograd saves while `fn` runs (parameters excluded)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def saved_activations(kind: str, hidden: int, mbs: int) -> dict[str, int]:
    """What autograd saves for one layer (and the embedding and head + loss of hf-*)."""
    x = torch.randn(mbs, SEQ, hidden, requires_grad=True)
    if kind == "transformer":
        from pipesched.executor.models import TransformerBlock
        block = TransformerBlock(hidden, hidden // 32)
        return {"layer": saved_bytes(lambda: block(x), list(block.parameters()))}
    from pipesched.executor.causal_lm import Blocks, Embedding, Head, causal_lm_loss, lm_parts
    from pipesched.executor.hf_models import HFModel
    lm = HFModel(kind, hidden=hidden, seq=SEQ, microbatch_size=mbs, vocab=VOCAB).causal_lm(1)
    parts, params = lm_parts(lm), list(lm.parameters())
    ids = torch.randint(0, VOCAB, (mbs, SEQ))
    block = Blocks([parts.blocks[0]], parts.rotary, parts.config)
    embed, head = Embedding(parts.tokens, parts.positions, parts.dropout), Head(parts.norm, parts.head)
    return {"layer": saved_bytes(lambda: block(x), params), "embedding": saved_bytes(lambda: embed(ids), params),
            "head": saved_bytes(lambda: causal_lm_loss(head(x), ids), params)}


# --- the comparison ------------------------------------------------------------------

def ratio(est: float, meas: float) -> float:
    return est / meas if meas > 0 else float("nan")


def summarise(title: str, errors: dict[str, list[float]]) -> None:
    print(f"{title}: |estimated / measured - 1| per op kind (median, worst; the ratios)")
    every = []
    for op, rs in errors.items():
        errs = [abs(r - 1) for r in rs]
        every += errs
        print(f"  {op:>4}: median {100 * statistics.median(errs):5.1f} %, worst {100 * max(errs):5.1f} %  "
              f"({', '.join(f'{r:.2f}' for r in rs)})")
    print(f"  all : median {100 * statistics.median(every):5.1f} %, worst {100 * max(every):5.1f} %  "
          "(targets: median 15 %, none over 30 %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--measure", choices=("both", "calibrate", "cpu-time"), default="both",
                    help="calibrate: `pipesched calibrate` (wall clock); cpu-time: the same profile in this "
                         "process in thread CPU seconds; both (default)")
    args = ap.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}; models are {', '.join(MODELS)}")
    ways = ("calibrate", "cpu-time") if args.measure == "both" else (args.measure,)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    configs = {n: model_config(MODELS[n][0], MODELS[n][1]) for n in names}
    shapes = sorted({s for n in names for s in gemm_shapes(configs[n], SEQ * MODELS[n][2])})
    sizes = sorted({(SEQ * MODELS[n][2], w) for n in names for w in (configs[n].hidden, configs[n].ffn)})
    rate, bandwidth = measured_gemm_rate(shapes), measured_bandwidth(sizes)
    hw = cpu_hardware(rate, bandwidth)
    print(f"this CPU, one thread (CPU time): matmul {rate / 1e9:.1f} GFLOP/s over {len(shapes)} shapes x 3 products; "
          f"memory-bound ops {bandwidth / 1e9:.2f} GB/s ({', '.join(_MEMORY_BOUND)}; a streaming add alone "
          f"{measured_bandwidth(sizes, ('add',)) / 1e9:.1f} GB/s); torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    errors: dict[str, dict[str, list[float]]] = {w: {} for w in ways}
    mem_errors: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            kind, hidden, mbs = MODELS[name]
            config = configs[name]
            est = estimate(config, Setup(seq=SEQ, microbatch_size=mbs, dtype="fp32", kernels="eager"), hw)
            layers = est.layer_costs()
            if kind == "transformer":  # no embedding, no head: the blocks alone
                layers = replace(layers, embedding=None, head=None)
            stages = layers.stage_costs([BLOCKS] * RANKS)
            measured, load = {}, []
            for way in ways:
                load.append(os.getloadavg()[0])
                measured[way] = (calibrated_stages(kind, hidden, mbs, folder) if way == "calibrate"
                                 else profiled_stages(kind, hidden, mbs))
            print(f"\n{name}: {config.describe()}; seq {SEQ}, microbatch {mbs}, fp32 (load average before: "
                  f"{', '.join(f'{x:.1f}' for x in load)})")
            print(f"  {'stage':>5} {'op':>4} {'estimated':>10}" + "".join(f" {w:>10} {'ratio':>6}" for w in ways))
            for k, s in enumerate(stages):
                rows = [("F", s.forward, lambda m: m["forward"])]
                if k == 0:
                    rows.append(("B+W", s.backward_input + s.backward_weight,
                                 lambda m: m["backward_input"] + m["backward_weight"]))
                else:
                    rows += [("B", s.backward_input, lambda m: m["backward_input"]),
                             ("W", s.backward_weight, lambda m: m["backward_weight"])]
                for op, e, get in rows:
                    line = f"  {k:>5} {op:>4} {e * 1e3:>8.2f}ms"
                    for way in ways:
                        mv = get(measured[way][k])
                        r = ratio(e, mv)
                        errors[way].setdefault(op, []).append(r)
                        line += f" {mv * 1e3:>8.2f}ms {r:>6.3f}"
                    print(line)
            saved = saved_activations(kind, hidden, mbs)
            pieces = {"layer": est.layer, "embedding": est.embedding, "head": est.head}
            line = []
            for what, got in saved.items():
                r = ratio(pieces[what].activation_memory, got)
                if what != "embedding":  # a few KiB of token ids: not a meaningful ratio
                    mem_errors.append(r)
                line.append(f"{what} {pieces[what].activation_memory / 2 ** 20:.3f} / {got / 2 ** 20:.3f} MiB "
                            f"({r:.3f})")
            print("  saved activations, estimated / counted: " + ", ".join(line))
    print()
    for way in ways:
        summarise({"calibrate": "against pipesched calibrate (wall clock on this shared machine)",
                   "cpu-time": "against the same profile in thread CPU time"}[way], errors[way])
    errs = [abs(r - 1) for r in mem_errors]
    print(f"saved activations (layers, heads): median {100 * statistics.median(errs):.2f} %, "
          f"worst {100 * max(errs):.2f} % (target 10 %)")


if __name__ == "__main__":
    main()
