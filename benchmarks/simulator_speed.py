"""Simulator speed and memory, against torch.distributed.pipelining's own simulator.

Prints ratios measured in the same run (times are wall-clock on this machine):
  1. zb-v, p=64, m=256, with communication: pipesched (build + validate + DES +
     metrics) against torch's get_schedule_ops(with_comms=True) + _simulate_comms_compute
     (unit time only). Target: pipesched at least 5x faster.
  2. p=128, m=1024, v=2 (interleaved-1f1b and zb-v): total time and peak memory of one
     pipesched simulation in a fresh process. Target: under 60 s and 4 GB.
Usage: python benchmarks/simulator_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def ours(name: str, p: int, m: int, v: int | None) -> dict:
    """One simulation with communication; times each phase (seconds)."""
    import resource

    from pipesched.schedules.registry import build
    from pipesched.schedules.validate import validate
    from pipesched.simulator.api import simulate
    from pipesched.simulator.costs import Link, Network, uniform
    from pipesched.simulator.metrics import compute_metrics

    costs = uniform(1e-3, 1e-3, 1e-3, activation_bytes=8e6, activation_memory=1e8,
                    network=Network(Link(2e-5, 1e10)))
    t0 = time.perf_counter()
    schedule = build(name, p, m, v)
    t1 = time.perf_counter()
    graph = validate(schedule)
    t2 = time.perf_counter()
    trace = simulate(graph, costs, engine="des")
    t3 = time.perf_counter()
    metrics = compute_metrics(trace, graph)
    t4 = time.perf_counter()
    return {"build": t1 - t0, "validate": t2 - t1, "simulate": t3 - t2, "metrics": t4 - t3, "total": t4 - t0,
            "tasks": len(graph.tasks), "spans": len(trace), "makespan": metrics.makespan,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def torch_reference(p: int, m: int) -> dict:
    import contextlib
    import io

    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    from torch.distributed.pipelining.schedules import _simulate_comms_compute

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        ops = get_schedule_ops("ZBVZeroBubble", p, m, with_comms=True)
    t1 = time.perf_counter()
    stage_rank = {}
    for rank, row in enumerate(ops):
        for a in row:
            if a is not None and a.stage_index >= 0:
                stage_rank.setdefault(a.stage_index, rank)
    # its simulator knows compute and send/receive actions only (not UNSHARD/RESHARD/REDUCE_GRAD)
    known = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
    order = {r: [a for a in row if a is None or a.computation_type.value in known] for r, row in enumerate(ops)}
    _simulate_comms_compute(order, lambda s: stage_rank[s], 2 * p)
    t2 = time.perf_counter()
    return {"get_schedule_ops": t1 - t0, "simulate_comms_compute": t2 - t1, "total": t2 - t0}


def in_fresh_process(kind: str, *args) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {HERE!r}); "
            f"import simulator_speed as b; print(json.dumps(b.{kind}(*{args!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p=32, m=128 and p=64, m=256 only (CI smoke run)")
    args = parser.parse_args()
    p, m = (32, 128) if args.quick else (64, 256)
    mine = in_fresh_process("ours", "zb-v", p, m, None)
    theirs = in_fresh_process("torch_reference", p, m)
    print(f"zb-v p={p} m={m} with communication ({mine['tasks']} ops, {mine['spans']} spans)")
    print(f"  pipesched: {mine['total']:.2f} s (build {mine['build']:.2f}, validate {mine['validate']:.2f}, "
          f"DES {mine['simulate']:.2f}, metrics {mine['metrics']:.2f})")
    print(f"  torch:     {theirs['total']:.2f} s (get_schedule_ops {theirs['get_schedule_ops']:.2f}, "
          f"_simulate_comms_compute {theirs['simulate_comms_compute']:.2f}; unit time, no memory)")
    print(f"  speed-up: {theirs['total'] / mine['total']:.1f}x (target >= 5x)")
    if args.quick:
        return
    for name in ("interleaved-1f1b", "zb-v"):
        big = in_fresh_process("ours", name, 128, 1024, 2 if name == "interleaved-1f1b" else None)
        print(f"{name} p=128 m=1024 v=2 ({big['tasks']} ops): {big['total']:.1f} s (target < 60 s), "
              f"peak RSS {big['peak_rss_bytes'] / 2**30:.2f} GiB (target < 4 GiB)")


if __name__ == "__main__":
    main()
