"""How long `pipesched plan` takes on the planning question of docs/choosing.md, at p = 8.

The user: 8 ranks, F 12 ms, B 14 ms, W 10 ms, 128 MiB activations over 50 GB/s; here
also 3 GiB of stored activations per microbatch and 12 GiB of parameters per stage.
Plans m in 8..64 (8, 16, 32, 64), v in {1, 2}, every built-in plus zb-auto, at four
memory limits per rank (24, 32, 40, 48 GiB), and prints:
  1. each limit as the user runs it: `pipesched plan` end to end (a process: import,
     the search on every core, recomputation off and on as its default "auto" does
     under a limit, the table), in wall-clock and CPU seconds;
  2. the same limit by the library in this process, one core, recomputation off
     (`simulator.planner.search`);
  3. the four limits in one process sharing the built-ins, which do not depend on the
     limit (`simulator.planner.search(..., cache=)`), and its ratio to 2.
Target: the four limits under 30 s (the command). Times are wall-clock on a machine that
may be shared (5 agents on 2 cores while this was written): compare ratios in one run.

With --cluster, the cluster question of docs/cluster.md instead: Llama 3 70B on H100s
(TP 8 + SP, seq 8192, DP 16 with ZeRO-1) under 80 GB a GPU, p in 4, 8, 16, m in p..8p
(p, 2p, 4p, 8p), v in {1, 2}, recomputation off and on, microbatches of 1, 2 and 4
sequences: for each p the `pipesched plan` command end to end (a process: import,
three estimates, the search, the table) beside the library call (`simulator.planner.plan`
on the three estimates), in wall-clock seconds. Target: the three p under a minute.
Usage: python benchmarks/plan_speed.py [--quick] [--cluster [--ranks 4,8,16]]
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
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


COMMAND = ["plan", "-p", "8", "--f", "12ms", "--b", "14ms", "--w", "10ms", "--activation-bytes", "128MiB",
           "--bandwidth", "50GB/s", "--activation-memory", "3GiB", "--param-bytes", "12GiB"]


def command(args: list[str]) -> tuple[float, float, str]:
    """Wall-clock and CPU seconds (the process and its workers) of `pipesched ARGS`, and its best line."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipesched", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"pipesched {' '.join(args)} failed: {done.stderr.strip()}")
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return wall, cpu, next(line for line in done.stdout.splitlines() if line.startswith("best:"))


CLUSTER = ["--model-preset", "llama3-70b", "--gpu", "h100-sxm", "--tp", "8", "--sp", "--seq", "8192", "--dp", "16",
           "--zero", "1", "--memory-limit", "80GB", "--microbatch-size", "1,2,4"]


def cluster(ranks: list[int]) -> None:
    """The cluster question, by the command and by the library, for each p."""
    import subprocess
    import sys

    from pipesched.simulator.estimate import Setup, estimate
    from pipesched.simulator.hardware import hardware
    from pipesched.simulator.model_config import preset
    from pipesched.simulator.planner import CostVariant, plan

    total_cli = total_lib = 0.0
    for p in ranks:
        argv = ["plan", "-p", str(p), "-m", f"{p}..{8 * p}", *CLUSTER]
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pipesched", *argv], capture_output=True, text=True)
        cli = time.perf_counter() - t
        if done.returncode:
            raise SystemExit(f"pipesched {' '.join(argv)} failed: {done.stderr.strip()}")
        best = next(line for line in done.stdout.splitlines() if line.startswith("best:"))
        t = time.perf_counter()
        model, hw = preset("llama3-70b"), hardware("h100-sxm")
        variants = [CostVariant(estimate(model, Setup(seq=8192, microbatch_size=b, tp=8, sp=True, dp=16, zero=1),
                                         hw).cost_model(), b, f"b={b}") for b in (1, 2, 4)]
        result = plan(p, [p, 2 * p, 4 * p, 8 * p], costs=variants, memory_limit=80e9)
        lib = time.perf_counter() - t
        total_cli, total_lib = total_cli + cli, total_lib + lib
        print(f"p={p:>2}: pipesched plan {cli:6.1f} s, library {lib:6.1f} s, {len(result.candidates)} candidates; "
              f"{best}", flush=True)
    print(f"all p: pipesched plan {total_cli:.1f} s, library {total_lib:.1f} s; target under 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="m in 8..16 only")
    parser.add_argument("--cluster", action="store_true", help="the Llama 3 70B cluster plan of docs/cluster.md")
    parser.add_argument("--ranks", default="4,8,16", help="with --cluster: the p to plan (default 4,8,16)")
    args = parser.parse_args()
    if args.cluster:
        cluster([int(x) for x in args.ranks.split(",")])
        return
    p, counts, vs = 8, [8, 16] if args.quick else [8, 16, 32, 64], [1, 2]
    names = [n for n, b in BUILDERS.items() if not b.searches] + ["zb-auto"]
    costs = user_costs()
    limits = [24, 32, 40, 48]
    print(f"plan p={p}, m in {counts}, v in {vs}, {len(names)} schedules (with zb-auto), limits {limits} GiB")
    alone = by_command = cpu_command = 0.0
    for gib in limits:
        wall, cpu, best_line = command([*COMMAND, "-m", f"{counts[0]}..{counts[-1]}", "--memory-limit", f"{gib}GiB"])
        by_command, cpu_command = by_command + wall, cpu_command + cpu
        print(f"  {gib} GiB, pipesched plan: {wall:6.2f} s (cpu {cpu:6.2f} s); {best_line}")
        t = time.perf_counter()
        found = search(names, p, counts, vs, costs, Budget(memory_limit=gib * GIB))
        dt = time.perf_counter() - t
        alone += dt
        print(f"  {gib} GiB, library, recomputation off: {dt:6.2f} s, {len(found)} candidates, best {best(found)}")
    print(f"four limits by pipesched plan: {by_command:.2f} s (cpu {cpu_command:.2f} s); target under 30 s")
    t = time.perf_counter()
    cache: dict = {}
    for gib in limits:
        search(names, p, counts, vs, costs, Budget(memory_limit=gib * GIB), cache=cache)
    shared = time.perf_counter() - t
    print(f"four limits by the library, each from scratch: {alone:.2f} s; sharing the built-ins: {shared:.2f} s "
          f"(ratio {alone / shared:.2f})")


if __name__ == "__main__":
    main()
