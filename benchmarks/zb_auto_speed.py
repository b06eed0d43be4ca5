"""How long plans take with zb-auto's search, each in a fresh process as `pipesched plan` runs, and against another tree.

The plans of benchmarks/plan_speed.py: p = 8, m in 8..64, v in {1, 2}, every built-in
plus zb-auto at 24, 32, 40 and 48 GiB per rank (the library's `search`, one process per
limit: no play remembered from another limit), and with --cluster the Llama 3 70B
cluster plan (`pipesched plan` over p in 4, 8, 16). With --against DIR (a checkout of
this repository, e.g. `git worktree add /tmp/old HEAD~1`) each run is timed with that
tree's package too, back to back, and the ratio printed with whether the answers are
the same (every candidate's schedule, m, v and makespan; the cluster plan's best line).
Times are wall-clock and CPU (user + system of the process: steadier where the machine
is shared, as other work slows the wall clock, not the CPU seconds); compare the ratios
of one run. Usage: python benchmarks/zb_auto_speed.py [--against DIR] [--cluster] [--quick]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"schedules": "schedules", "simulator": "simulator", "executor": "executor"}  # as pyproject maps them

LIMIT_PLAN = """
from pipesched.schedules.registry import BUILDERS
from pipesched.simulator.budget import Budget
from pipesched.simulator.cost_model import uniform
from pipesched.simulator.costs import Link, Network
from pipesched.simulator.planner import search
GIB = 2 ** 30
costs = uniform(0.012, 0.014, 0.010, activation_bytes=128 * 2 ** 20, activation_memory=3 * GIB,
                param_bytes=12 * GIB, network=Network(Link(0.0, 50e9)))
names = [n for n, b in BUILDERS.items() if not b.searches] + ["zb-auto"]
for c in search(names, 8, {counts}, [1, 2], costs, Budget(memory_limit={gib} * GIB)):
    print(c.schedule, c.microbatches, c.v, c.error or repr(c.result.makespan))
"""

CLUSTER = ["--model-preset", "llama3-70b", "--gpu", "h100-sxm", "--tp", "8", "--sp", "--seq", "8192", "--dp", "16",
           "--zero", "1", "--memory-limit", "80GB", "--microbatch-size", "1,2,4"]


def importable(tree: Path, into: Path) -> Path:
    """A folder that imports `tree`'s package as pipesched (PYTHONPATH): its pipesched/
    with the top-level folders pyproject maps into it linked in."""
    shutil.copytree(tree / "pipesched", into / "pipesched", ignore=shutil.ignore_patterns("__pycache__"))
    for name, folder in PACKAGES.items():
        os.symlink(tree / folder, into / "pipesched" / name)
    return into


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(args: list[str], path: Path | None) -> tuple[float, float, str]:
    """Wall-clock and CPU seconds `python args` takes (with `path` first on PYTHONPATH)
    and what it printed."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    t, cpu = time.perf_counter(), _child_cpu()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=path or ROOT)
    seconds, cpu = time.perf_counter() - t, _child_cpu() - cpu
    if done.returncode:
        raise SystemExit(f"python {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return seconds, cpu, done.stdout


def compare(label: str, args: list[str], answer, trees: list[Path | None], totals: list[list[float]]) -> None:
    """Time one run with each tree and print the times (wall-clock, CPU), the ratios and
    whether the answers agree."""
    runs = [timed(args, tree) for tree in trees]
    for i, (seconds, cpu, _) in enumerate(runs):
        totals[i][0] += seconds
        totals[i][1] += cpu
    line = f"{label}: {runs[0][0]:7.1f} s (cpu {runs[0][1]:6.1f} s)"
    if len(runs) > 1:
        same = answer(runs[0][2]) == answer(runs[1][2])
        line += (f", against {runs[1][0]:7.1f} s (cpu {runs[1][1]:6.1f} s), x{runs[1][0] / runs[0][0]:.2f} "
                 f"(cpu x{runs[1][1] / runs[0][1]:.2f}), {'same' if same else 'DIFFERENT'} answer")
    print(line, flush=True)


def best_line(out: str) -> str:
    return next((line for line in out.splitlines() if line.startswith("best:")), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout to time too (the before of a change)")
    parser.add_argument("--cluster", action="store_true", help="the Llama 3 70B cluster plan instead")
    parser.add_argument("--quick", action="store_true", help="m in 8..16 only; with --cluster p = 4 only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees: list[Path | None] = [None]
        if args.against is not None:
            trees.append(importable(args.against.resolve(), Path(tmp)))
        totals = [[0.0, 0.0] for _ in trees]  # wall-clock, CPU seconds
        if args.cluster:
            for p in [4] if args.quick else [4, 8, 16]:
                argv = ["-m", "pipesched", "plan", "-p", str(p), "-m", f"{p}..{8 * p}", *CLUSTER]
                compare(f"cluster plan p={p:>2}", argv, best_line, trees, totals)
            target = 60
        else:
            counts = [8, 16] if args.quick else [8, 16, 32, 64]
            for gib in (24, 32, 40, 48):
                code = LIMIT_PLAN.format(counts=counts, gib=gib)
                compare(f"plan at {gib} GiB", ["-c", code], lambda out: out, trees, totals)
            target = 30
        (wall, cpu) = totals[0]
        line = f"all: {wall:.1f} s, cpu {cpu:.1f} s (target under {target} s)"
        if len(trees) > 1:
            (old_wall, old_cpu) = totals[1]
            line += f", against {old_wall:.1f} s, cpu {old_cpu:.1f} s (x{old_wall / wall:.2f}, cpu x{old_cpu / cpu:.2f})"
        print(line)


if __name__ == "__main__":
    main()
