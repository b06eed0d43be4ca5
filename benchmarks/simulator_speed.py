"""Simulator speed, end to end and per library call, against torch.distributed.pipelining.

Prints ratios measured in the same run (wall-clock seconds on this machine):
  1. zb-v, p=64, m=256, with communication: the command a user runs,
     `pipesched simulate zb-v -p 64 -m 256 --latency 0.01 --json` (a subprocess, so
     interpreter start and imports count; the median of 3 runs), and the library calls (build, validate,
     simulate, metrics), against torch's get_schedule_ops(with_comms=True) +
     _simulate_comms_compute (unit time only). Target: the command >= 10x faster.
  2. One exact evaluation (resolve costs, longest path, Trace with memory) of zb-v
     p=128, m=1024 (786k ops), in a fresh process. Target: <= 2 s.
  3. A sweep of every built-in (zb-auto included) over p in {4, 8, 16}, m in {p, 2p, 4p,
     8p}, v in {1, 2} (v only for the schedules that take it) on the exact engine: in one
     process (`pipesched.sweep`, the command's library call) and as the six `pipesched sweep -p P
     -v V --schedules ALL` commands. Target: <= 20 s.
Usage: python benchmarks/simulator_speed.py [--quick] [--part command|big|sweep] [--out FILE]
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
PIPESCHED = [sys.executable, "-m", "pipesched"]


def ours(name: str, p: int, m: int, v: int | None, engine: str = "auto") -> dict:
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
    schedule = build(name, p, m, v, costs.op_time_for(p))
    t1 = time.perf_counter()
    graph = validate(schedule)
    t2 = time.perf_counter()
    trace = simulate(graph, costs, engine=engine)
    t3 = time.perf_counter()
    metrics = compute_metrics(trace, graph)
    t4 = time.perf_counter()
    return {"build": t1 - t0, "validate": t2 - t1, "simulate": t3 - t2, "metrics": t4 - t3, "total": t4 - t0,
            "tasks": len(graph.tasks), "spans": len(trace), "makespan": metrics.makespan,
            "engine": trace.meta["engine"], "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


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


def exact_evaluation(name: str, p: int, m: int) -> dict:
    """Build and validate (untimed), then one exact evaluation: costs resolved, longest
    path, Trace with memory (seconds)."""
    from pipesched.schedules.registry import build
    from pipesched.schedules.validate import validate
    from pipesched.simulator.api import simulate
    from pipesched.simulator.costs import Link, Network, uniform

    costs = uniform(1e-3, 1e-3, 1e-3, activation_bytes=8e6, activation_memory=1e8,
                    network=Network(Link(2e-5, 1e10)))
    t0 = time.perf_counter()
    graph = validate(build(name, p, m))
    t1 = time.perf_counter()
    trace = simulate(graph, costs, engine="exact")
    t2 = time.perf_counter()
    return {"tasks": len(graph.tasks), "build_validate": t1 - t0, "evaluate": t2 - t1,
            "makespan": float(trace.end.max())}


SWEEP_PS, SWEEP_VS = (4, 8, 16), (1, 2)


def sweep_library() -> dict:
    """What the sweep commands below do, in this process: `pipesched.sweep` (the library
    function the command calls) over every built-in, zb-auto included, at every (p, m, v)
    of the grid, on the exact engine. Schedules with a fixed chunk count run in both v
    sweeps, as in the commands."""
    import pipesched as ps
    from pipesched.schedules.registry import BUILDERS

    t0 = time.perf_counter()
    rows = []
    for p in SWEEP_PS:
        for v in SWEEP_VS:
            rows += ps.sweep(p, [p, 2 * p, 4 * p, 8 * p], list(BUILDERS), chunks=v, engine="exact")
    skipped = sum(1 for r in rows if r.point.error)
    return {"points": len(rows) - skipped, "skipped": skipped, "total": time.perf_counter() - t0}


def timed_command(args: list[str]) -> float:
    """Wall seconds of one pipesched command in a subprocess (output discarded)."""
    t0 = time.perf_counter()
    subprocess.run(PIPESCHED + args, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def sweep_command(p: int, v: int) -> list[str]:
    """`pipesched sweep` at one p and v over every built-in (zb-auto too), m in {p, 2p, 4p, 8p}."""
    from pipesched.schedules.registry import BUILDERS

    return ["sweep", "-p", str(p), "-m", ",".join(str(k * p) for k in (1, 2, 4, 8)), "-v", str(v),
            "--engine", "exact", "--schedules", ",".join(BUILDERS)]


def sweep_commands() -> dict:
    """The six sweep commands (one per p and v), end to end."""
    t = 0.0
    for p in SWEEP_PS:
        for v in SWEEP_VS:
            t += timed_command(sweep_command(p, v))
    return {"commands": len(SWEEP_PS) * len(SWEEP_VS), "total": t}


def in_fresh_process(kind: str, *args) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {HERE!r}); "
            f"import simulator_speed as b; print(json.dumps(b.{kind}(*{args!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p=32, m=128 only (smoke run)")
    parser.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    parser.add_argument("--part", choices=("all", "command", "big", "sweep"), default="all",
                        help="run one part only: 1 (command), 2 (big) or 3 (sweep)")
    args = parser.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start "
        "(ratios are from this one run; absolute times move with the load)")
    if args.part in ("all", "command"):
        p, m = (32, 128) if args.quick else (64, 256)
        command = ["simulate", "zb-v", "-p", str(p), "-m", str(m), "--latency", "0.01", "--json"]
        runs = sorted(timed_command(command) for _ in range(3))  # the command is short: three runs, load varies
        cli = runs[1]
        mine = in_fresh_process("ours", "zb-v", p, m, None)
        des = in_fresh_process("ours", "zb-v", p, m, None, "des")
        theirs = in_fresh_process("torch_reference", p, m)
        say(f"zb-v p={p} m={m} with communication ({mine['tasks']} ops, {mine['spans']} spans)")
        say(f"  command `pipesched {' '.join(command)}`: {cli:.2f} s end to end (median of 3 runs: "
            f"{', '.join(f'{t:.2f}' for t in runs)} s)")
        say(f"  library, auto engine ({mine['engine']}): {mine['total']:.2f} s (build {mine['build']:.2f}, "
            f"validate {mine['validate']:.2f}, simulate {mine['simulate']:.2f}, metrics {mine['metrics']:.2f})")
        say(f"  library, DES: {des['total']:.2f} s (simulate {des['simulate']:.2f}); same makespan: "
            f"{abs(des['makespan'] - mine['makespan']) <= 1e-9 * mine['makespan']}")
        say(f"  torch: {theirs['total']:.2f} s (get_schedule_ops {theirs['get_schedule_ops']:.2f}, "
            f"_simulate_comms_compute {theirs['simulate_comms_compute']:.2f}; unit time, no memory)")
        say(f"  torch / command: {theirs['total'] / cli:.1f}x (target >= 10x); torch / library: "
            f"{theirs['total'] / mine['total']:.1f}x; torch / library with the DES: {theirs['total'] / des['total']:.1f}x")
    if not args.quick and args.part in ("all", "big"):
        big = in_fresh_process("exact_evaluation", "zb-v", 128, 1024)
        say(f"zb-v p=128 m=1024 ({big['tasks']} ops): one exact evaluation {big['evaluate']:.2f} s (target <= 2 s); "
            f"build + validate {big['build_validate']:.2f} s")
    if not args.quick and args.part in ("all", "sweep"):
        lib = in_fresh_process("sweep_library")
        say(f"sweep of all {len(sweep_command(4, 1)[-1].split(','))} built-ins (zb-auto too), library calls (pipesched.sweep): {lib['points']} "
            f"points (p in {SWEEP_PS}, m in p..8p x2, v in {SWEEP_VS}; {lib['skipped']} refused) in "
            f"{lib['total']:.1f} s (target <= 20 s)")
        cmds = sweep_commands()
        say(f"sweep, {cmds['commands']} commands `pipesched {' '.join(sweep_command(4, 1))}` (and P = 8, 16, "
            f"V = 2): {cmds['total']:.1f} s end to end (target <= 20 s)")
    say(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# python benchmarks/simulator_speed.py ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
