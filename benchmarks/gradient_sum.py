"""DualPipe's shared-gradient sum: the calibrated `gradient_sum` against the sum measured
inside steps, and the period predicted with it and without it (the link-priced sum).

For each --hidden (the example MLP, p = 2, m = 8, microbatch 32):

1. `pipesched validate dualpipe --step-barrier none` (calibration, the in-turn run, the
   period run), its costs.json kept;
2. the period re-predicted from that costs.json as is and with `gradient_sum` deleted
   (the sum priced by the links and host times, as older cost files have it), against
   the measured period the command printed;
3. the sum alone as each cost model prices it (both ranks done at 0), and measured in a
   separate launch of 10 DualPipe steps back to back: per step, from the later rank's
   entry into `sum_shared_grads` to the later rank's exit (median, min, max).

Usage: python benchmarks/gradient_sum.py [--hidden 96,384,512] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import load
from pipesched.simulator.shared_grads import shared_sums

P, M, MICROBATCH = 2, 8, 32  # validate's example MLP, as `pipesched validate` builds it by default


def in_step_sums(ctx, hidden: int):
    """Collective: 10 steps (after 2) of DualPipe back to back, each rank's
    `sum_shared_grads` timed; rank 0 gets the per-step sums (seconds)."""
    import torch.distributed as dist
    from pipesched.executor import runtime
    from pipesched.executor.job import RunOptions, run_schedule
    from pipesched.executor.models import ExampleModel

    marks = []
    original = runtime.replicas.sum_shared_grads

    def timed(*args, **kwargs):
        start = time.time()
        original(*args, **kwargs)
        marks.append((start, time.time()))

    runtime.replicas.sum_shared_grads = timed
    run_schedule(ctx, build("dualpipe", P, M), ExampleModel(kind="mlp", hidden=hidden, microbatch_size=MICROBATCH),
                 RunOptions(steps=10, warmup=2, step_barrier="none", check=False))
    everyone = [None] * ctx.world
    dist.all_gather_object(everyone, marks)
    if ctx.rank:
        return None
    return [max(e for _, e in step) - max(s for s, _ in step) for step in zip(*everyone)][2:]


def priced_sum(costs) -> float:
    """Seconds the cost model gives the sum with both ranks done at 0."""
    sched = build("dualpipe", P, M)
    stages = costs.model_stage_costs(P, sched.num_model_stages)
    sums = shared_sums(sched, stages, costs.network, costs.host_overhead, costs.gradient_sum)
    return float(sums.ends(np.zeros(P)).max())


def one(hidden: int, out: Path) -> None:
    from pipesched.executor.launch import launch_local

    folder = out / f"hidden{hidden}"
    load_avg = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-m", "pipesched", "validate", "dualpipe", "-p", str(P), "-m", str(M),
                           "--step-barrier", "none", "--model", "mlp", "--hidden", str(hidden),
                           "--microbatch-size", str(MICROBATCH), "--out", str(folder)],
                          capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("period"))
    measured = float(re.findall(r"([\d.]+) ms", line)[1]) / 1e3
    costs = load(folder / "costs.json")
    without = replace(costs, gradient_sum=None)
    graph = validate(build("dualpipe", P, M))
    period = {name: simulate(graph, c, steps=8, step_barrier="none").meta["steps"]["period"]
              for name, c in (("links", without), ("calibrated", costs))}
    timed = costs.meta["calibrated"]["gradient_sum"]
    sums = launch_local(in_step_sums, (hidden,), P, "gloo", 300)
    g = costs.gradient_sum
    points = ", ".join(f"{n / 1e6:.2f} MB {t * 1e3:.2f} ms" for n, t in zip(timed["sizes"], timed["seconds"]))
    print(f"hidden {hidden} (load {load_avg:.2f}): timed {points}; fit {g.fixed * 1e3:.3f} ms + "
          f"{g.per_byte * 1e9:.3f} ns/B")
    print(f"  sum: links {priced_sum(without) * 1e3:.1f} ms, calibrated {priced_sum(costs) * 1e3:.1f} ms, "
          f"in steps median {statistics.median(sums) * 1e3:.1f} ms ({min(sums) * 1e3:.1f}-{max(sums) * 1e3:.1f})")
    print(f"  period measured {measured * 1e3:.1f} ms; predicted links {period['links'] * 1e3:.1f} ms "
          f"({100 * (period['links'] / measured - 1):+.1f} %), calibrated {period['calibrated'] * 1e3:.1f} ms "
          f"({100 * (period['calibrated'] / measured - 1):+.1f} %)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="96,384,512")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="gradient-sum-"))
    print(f"# runs kept in {out}")
    for h in (int(x) for x in args.hidden.split(",")):
        one(h, out)


if __name__ == "__main__":
    main()
