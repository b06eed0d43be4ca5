"""How long `pipesched plan` takes on the planning question of docs/choosing.md, at p = 8.

The user: 8 ranks, F 12 ms, B 14 ms, W 10 ms, 128 MiB activations over 50 GB/s; here
also 3 GiB of stored activations per microbatch and 12 GiB of parameters per stage.
Plans m in 8..64 (8, 16, 32, 64), v in {1, 2}, every built-in plus zb-auto, at four
memory limits per rank (24, 32, 40, 48 GiB), and prints:
  1. each limit planned from scratch, as one `pipesched plan` run does (wall-clock s);
  2. the four limits in one process sharing the built-ins, which do not depend on the
     limit (`simulator.planner.search(..., cache=)`), and its ratio to 1.
Target: the four limits under 30 s. Times are wall-clock on a machine that
may be shared (5 agents on 2 cores while this was written): compare ratios in one run.
Usage: python benchmarks/plan_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import time

from pipesched.schedules.registry import BUILDERS
from pipesched.simulator.budget import Budget
from pipesched.simulator.planner import search
from pipesched.simulator.costs import uniform
from pipesched.simulator.units import parse_bandwidth, parse_bytes, parse_seconds

GIB = 2 ** 30


def user_costs():
    from pipesched.simulator.costs import Link, Network
    return uniform(parse_seconds("12ms"), parse_seconds("14ms"), parse_seconds("10ms"),
                   activation_bytes=parse_bytes("128MiB"), activation_memory=3 * GIB, param_bytes=12 * GIB,
                   network=Network(Link(0.0, parse_bandwidth("50GB/s"))))


def best(found):
    fitting = [c for c in found if c.result and c.result.fits]
    top = max(fitting, key=lambda c: c.microbatches / c.result.makespan)
    return f"{top.schedule} m={top.microbatches} v={top.v} {top.result.makespan:.4f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="m in 8..16 only")
    args = parser.parse_args()
    p, counts, vs = 8, [8, 16] if args.quick else [8, 16, 32, 64], [1, 2]
    names = [n for n, b in BUILDERS.items() if not b.searches] + ["zb-auto"]
    costs = user_costs()
    limits = [24, 32, 40, 48]
    print(f"plan p={p}, m in {counts}, v in {vs}, {len(names)} schedules (with zb-auto), limits {limits} GiB")
    alone = 0.0
    for gib in limits:
        t = time.perf_counter()
        found = search(names, p, counts, vs, costs, Budget(memory_limit=gib * GIB))
        dt = time.perf_counter() - t
        alone += dt
        print(f"  {gib} GiB from scratch: {dt:6.2f} s, {len(found)} candidates, best {best(found)}")
    t = time.perf_counter()
    cache: dict = {}
    for gib in limits:
        search(names, p, counts, vs, costs, Budget(memory_limit=gib * GIB), cache=cache)
    shared = time.perf_counter() - t
    print(f"four limits, each from scratch: {alone:.2f} s; sharing the built-ins: {shared:.2f} s "
          f"(ratio {alone / shared:.2f}); target under 30 s")


if __name__ == "__main__":
    main()
