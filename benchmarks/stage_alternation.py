"""Does an op run slower right after an op of another model stage on the same core?

A DualPipe rank holds two model stages and alternates between them; the calibration runs
(1F1B, ZB-H1) hold one. In seeded runs (docs/accuracy.md) DualPipe's ops took up to 50 %
longer than the same ops in 1F1B, most on small models. This measures it in one process,
one thread, with nothing else running: each example model stage's forward and fused
backward (a) back to back with itself, (b) each right after the forward and backward of
the next model stage, (c) right after those of a copy of itself (same shapes, other
memory: what a calibration could measure on one rank without building another stage),
and (d) the second time in a row after the copy's (copy, own, own timed: an op that does
not switch, on a rank whose other stage ran just before; DualPipe runs many). Printed
per model: the medians and the ratios (b)/(a), (c)/(a) and (d)/(a), measured in the
same run.

    python benchmarks/stage_alternation.py [--repeats 300]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesched.executor.models import ExampleModel  # noqa: E402

MODELS = (("mlp", 224, 2, 4), ("mlp", 128, 4, 16), ("mlp", 160, 2, 8), ("mlp", 352, 2, 4),
          ("mlp", 512, 4, 16), ("mlp", 704, 2, 4), ("transformer", 96, 2, 4), ("transformer", 192, 2, 2))


def forward_backward(module: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """Seconds of one forward and one backward (of the sum of the output)."""
    start = time.perf_counter()
    y = module(x.requires_grad_(True))
    mid = time.perf_counter()
    y.float().sum().backward()
    return mid - start, time.perf_counter() - mid


def measure(model: ExampleModel, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (forward, backward) seconds of stage 0 alone, after stage 1, after a copy of
    stage 0, and after the copy and then itself once."""
    own, other = model.build_stage(0), model.build_stage(1)
    twin = copy.deepcopy(own)
    x = model.microbatch(0)[0]
    out = {}
    for label, before in (("alone", ()), ("after the next stage", (other,)), ("after a copy of itself", (twin,)),
                          ("second after a copy", (twin, own))):
        for _ in range(repeats // 5):  # warm-up
            forward_backward(own, x)
            for module in before:
                forward_backward(module, x)
        samples = []
        for _ in range(repeats):
            samples.append(forward_backward(own, x))
            for module in before:
                forward_backward(module, x)
        out[label] = (statistics.median(f for f, _ in samples), statistics.median(b for _, b in samples))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, one thread; medians of {args.repeats}")
    for kind, hidden, blocks, mbs in MODELS:
        model = ExampleModel(kind, hidden=hidden, layers_per_stage=blocks, microbatch_size=mbs, seq=32)
        got = measure(model, args.repeats)
        f0, b0 = got["alone"]
        parts = [f"F alone {1e3 * f0:.3f} ms, backward alone {1e3 * b0:.3f} ms"]
        for label in ("after the next stage", "after a copy of itself", "second after a copy"):
            f, b = got[label]
            parts.append(f"{label}: F {100 * (f / f0 - 1):+.1f} %, backward {100 * (b / b0 - 1):+.1f} %")
        print(f"{kind} hidden {hidden}, {blocks} blocks, microbatch {mbs}: " + "; ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
