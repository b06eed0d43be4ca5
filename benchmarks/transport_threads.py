"""Where gloo's event loops run: on the rank's own core, or off it (`executor.placement`).

For models drawn from the accuracy benchmark's seeded generator, one launch per model
runs every schedule twice, once with the event loops of each rank's link groups on its
own core (as before 2026-11-26, and still where ranks outnumber the cores) and once on the
job's other cores (the default where each rank has cores of its own), their
measured steps taken in turn (own, off, own, off, ...) so that the host's drift slows
both alike. Printed per model and schedule: the median step makespan each way and their
ratio (off / own), each way's steps spread (interquartile range over median) and its
longest idle gap between two ops of one rank in the median step (a spinning loop stalls
its rank 3-5 ms with nothing to wait for); then the geometric-mean ratio per model, for
models whose ops are short (`validate` would warn) and long, and over all.

    python benchmarks/transport_threads.py --seed 2046 --models 6 [--ranks 2] [--steps 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_random import SCHEDULES, draw_models, estimated_forward  # noqa: E402

from pipesched.schedules.ir import ScheduleError  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.run_costs import relative_iqr  # noqa: E402
from pipesched.simulator.trace import COMPUTE  # noqa: E402

PLACEMENTS = ("own", "off")
SHORT_FORWARD_S = 1.5e-3  # an estimated forward under this is a short-op model (validate warns of those)


def both_ways(ctx, p: int, draw, options):
    """One launch: every schedule that builds, run twice (`run_in_turn`), the links'
    event loops moved to the rank's own core before each 'own' step and off it before
    each 'off' step. Rank 0 returns {(name, placement): RunResult}."""
    from pipesched.executor.comm import link_groups
    from pipesched.executor.job import run_in_turn
    from pipesched.executor.placement import job_cores, place_transport_threads, transport_threads

    own = set(os.sched_getaffinity(0))
    where = {"own": own, "off": job_cores() - own or own}
    schedules = []
    for name in SCHEDULES:
        try:
            schedules.append(build(name, p, draw.m_per_p[p]))
        except ScheduleError:
            continue
    before = set(transport_threads())
    link_groups([(a, b) for a in range(p) for b in range(p) if a != b])  # every link's group now
    loops = set(transport_threads()) - before  # the links' loops (the default group's stays on its core)
    keys = [(s.name, way) for s in schedules for way in PLACEMENTS]
    runs = [(s, draw.model(s.num_model_stages // p), options) for s in schedules for _ in PLACEMENTS]
    results = run_in_turn(ctx, runs, before_step=lambda i: place_transport_threads(loops, where[keys[i][1]]))
    return dict(zip(keys, results)) if ctx.rank == 0 else None


def longest_gap(trace) -> float:
    """Seconds: the longest idle time between two consecutive ops of one rank."""
    longest = 0.0
    for r in range(trace.ranks):
        c = np.flatnonzero((trace.rank == r) & (trace.lane == COMPUTE))
        c = c[np.argsort(trace.start[c])]
        if len(c) > 1:
            longest = max(longest, float((trace.start[c[1:]] - trace.end[c[:-1]]).max()))
    return longest


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=2046)
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    from pipesched.executor.job import RunOptions
    from pipesched.executor.launch import launch_local

    p = args.ranks
    options = RunOptions(steps=args.steps, warmup=args.warmup, check=False, timeout=600)
    print(f"seed {args.seed}, p = {p}, {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'model':>5} {'schedule':17} {'own':>9} {'off':>9} {'off/own':>8} {'spread own':>10} {'off':>6} "
          f"{'gap own':>8} {'off':>7}")
    ratios: dict[str, list[float]] = {"short": [], "long": []}
    started = time.perf_counter()
    for i, draw in enumerate(draw_models(args.seed, args.models, [p])):
        results = launch_local(both_ways, (p, draw, options), p, timeout=600)
        short = estimated_forward(draw) < SHORT_FORWARD_S
        mine = []
        for name in dict.fromkeys(n for n, _ in results):
            own, off = results[(name, "own")], results[(name, "off")]
            a, b = (statistics.median(r.trace.meta["makespans"]) for r in (own, off))
            mine.append(b / a)
            print(f"{i:5} {name:17} {a * 1e3:7.2f}ms {b * 1e3:7.2f}ms {b / a:8.3f} "
                  f"{relative_iqr(own.trace.meta['makespans']):10.1%} {relative_iqr(off.trace.meta['makespans']):6.1%} "
                  f"{longest_gap(own.trace) * 1e3:6.2f}ms {longest_gap(off.trace) * 1e3:5.2f}ms")
        ratios["short" if short else "long"] += mine
        print(f"      model {i}: {draw.kind} hidden {draw.hidden}, {draw.depth} blocks, microbatch "
              f"{draw.microbatch_size}, m {draw.m_per_p[p]}, {'short' if short else 'long'} ops: off / own "
              f"{geomean(mine):.3f}", flush=True)
    for label, values in ratios.items():
        if values:
            print(f"{label} ops: off / own geometric mean {geomean(values):.3f} over {len(values)} runs "
                  f"(min {min(values):.3f}, max {max(values):.3f})")
    both = ratios["short"] + ratios["long"]
    print(f"all: off / own geometric mean {geomean(both):.3f} over {len(both)} runs; "
          f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
