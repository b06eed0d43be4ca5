"""zb-auto against sail-sg's zero-bubble schedulers at equal activation memory.

sail-sg/zero-bubble-pipeline-parallelism (Qi et al.) ships automatic schedulers: `zb`
(one chunk per rank, a greedy heuristic tried under eight flag combinations; named
auto_schedule.py in older trees), `zbv` (two chunks in a V, a greedy play with
bubble-approving retries), `zbv_greedy` (V-Half / V-Min from the paper's building blocks,
squeezed and reordered) and `v_auto_schedule` (a search over V building blocks under a
memory limit). This script runs them from a copy of their source kept OUTSIDE this
repository (`--sailsg DIR`, any folder holding their scheduler files; nothing of theirs
is imported otherwise), converts each order they return to a pipesched Schedule and
times it with the same function as ours.

Memory, the same for both: the peak over ranks of activations held, counted from a
stage's F to its W (F +1, W -1, B 0), in microbatches of one pipeline stage (a chunk of a
two-chunk rank counts 1/2). That is how their V code counts (`get_peak_mem`,
`mem_of_stage`: F/f +1, W/w -1, in chunk units) and how `zb` counts with mem_f = 1,
mem_b = 0, mem_w = -1 (given to it here); `schedules.activations.peak_activations`
measures every order, theirs and ours, and an order above the limit is not counted.
Their limits are passed in their units: L for `zb`, 2L chunk activations for the V
schedulers (`v_auto_schedule` caps itself at 2p, i.e. L = p).

Time: one step's makespan with free transfers (their comm cost 0), op durations per
pipeline stage F, B, W (a chunk of two takes half), `schedules.timeline.makespan_under`
for every order. Their variants (flags, patterns) are each timed and the best counts
("theirs" is the best order any of their schedulers produced, which is at least as
good as what each would pick by its own estimate).

Grid (108 configurations): p in {4, 8}, m in {2p, 3p, 4p}, (F, B, W) in {(1,1,1),
(1,2,1), (2,3,1)}; two chunks at L = V-Min's (p+4)//3, V-Half's (p+2)//2 and p; one
chunk at L = p, 3p/2 and 2p. `--all-limits` adds every integer L from V-Min's to 2p on
both. Ours: `zb-auto` at max_activations = L with that v, timed (its play cache emptied
first), and the built-ins that fit (the best one is shown).

Usage: python benchmarks/zb_vs_sailsg.py [--sailsg DIR] [--p 4,8] [--all-limits]
Without --sailsg only our side is printed (their code is not in this repository).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import sys
import time
import types
from pathlib import Path

from pipesched.schedules import bounded, v_pattern
from pipesched.schedules.activations import peak_activations
from pipesched.schedules.ir import B, F, W, Schedule, Task, looped_stages, uniform_paths, v_stages
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.timeline import makespan_under
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import uniform

COSTS = ((1, 1, 1), (1, 2, 1), (2, 3, 1))
PACKAGE = "megatron.core.pipeline_parallel.zerobubble.scheduler"
NAMES = {"graph": ("graph.py",), "zb": ("zb.py", "auto_schedule.py"), "zbv": ("zbv.py", "v_schedule.py"),
         "zbv_greedy": ("zbv_greedy.py",), "v_auto": ("v_auto_schedule.py",)}


# --- their code, loaded from outside the repository --------------------------------------

def load_theirs(root: str) -> dict[str, types.ModuleType]:
    """Their scheduler modules by short name (those found under `root`). Their package
    path is stubbed so that `from megatron...scheduler.graph import ...` finds their
    graph.py; pulp (imported by zb.py for its ILP, unused here) is stubbed if absent."""
    found: dict[str, Path] = {}
    for path in sorted(Path(root).rglob("*.py")):
        for key, names in NAMES.items():
            if path.name in names and key not in found:
                found[key] = path
    if "graph" not in found:
        raise SystemExit(f"--sailsg {root}: no graph.py of their scheduler package there")
    parts = PACKAGE.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = []
            sys.modules[name] = mod
    if importlib.util.find_spec("pulp") is None:
        sys.modules["pulp"] = types.ModuleType("pulp")
    modules = {}
    for key in ("graph", "zb", "zbv", "zbv_greedy", "v_auto"):
        if key not in found:
            continue
        name = f"{PACKAGE}.graph" if key == "graph" else f"sailsg_{key}"
        spec = importlib.util.spec_from_file_location(name, found[key])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # a tree whose file has another API: reported, not fatal
            print(f"  (their {found[key].name} not loaded: {type(exc).__name__}: {exc})")
            continue
        modules[key] = mod
    return modules


def _schedule(p: int, m: int, v: int, programs: list[list[tuple[str, int, int]]], name: str) -> Schedule:
    """A pipesched Schedule from per-rank (op, microbatch, chunk) lists; chunk 0 of rank r
    is model stage r, chunk 1 (the V) model stage 2p-1-r."""
    stages = looped_stages(p, 1) if v == 1 else v_stages(p)
    paths, mb_paths = uniform_paths(stages, m)
    progs = [[Task(op, mb, r if c == 0 else 2 * p - 1 - r) for op, mb, c in prog] for r, prog in enumerate(programs)]
    s = Schedule(name, p, m, stages, paths, mb_paths, progs, {"v": v})
    validate(s)
    return s


def theirs_one_chunk(mods, p, m, fbw, limit):
    """`zb`'s greedy under each of its eight flag combinations, at max_mem = limit."""
    if "zb" not in mods:
        return []
    zb, graph = mods["zb"], sys.modules[f"{PACKAGE}.graph"]
    f, b, w = map(float, fbw)
    config = graph.GraphConfig(cost_f=[f] * p, cost_b=[b] * p, cost_w=[w] * p, cost_comm=0.0,
                               mem_f=[1.0] * p, mem_b=[0.0] * p, mem_w=[-1.0] * p, max_mem=[float(limit)] * p,
                               n_stages=p, n_micro=m)
    g = zb.Graph.build_graph(p, m, config)
    out = []
    for flags in [(a, bb, c) for a in (True, False) for bb in (True, False) for c in (True, False)]:
        try:
            _, t, _ = g.manual_order(*flags)
        except (ValueError, AssertionError, IndexError):
            continue
        programs = []
        for stage in range(p):
            ops = [(t[g.get_id(k, stage, mb)], op, mb) for k, op in enumerate((F, B, W)) for mb in range(m)]
            programs.append([(op, mb, 0) for _, op, mb in sorted(ops)])
        out.append(("zb", _schedule(p, m, 1, programs, "zb")))
    return out


def theirs_v(mods, p, m, fbw, limit):
    """Their V schedulers at 2*limit chunk activations: zbv (four fill flags), zbv_greedy
    (half, min), v_auto_schedule (a pattern search capped at 2p)."""
    f, b, w = fbw
    out = []
    if "zbv" in mods:
        g = mods["zbv"].PipelineGraph(p, m, f, b, w, 0, 1, 0, -1, max_mem=2 * limit)
        for fill_b in (True, False):
            for fill_f in (True, False):
                try:
                    sched, _, _ = g.try_v_schedule(fill_f=fill_f, fill_b=fill_b)
                except (AssertionError, IndexError, ValueError):
                    continue
                # their cat 0 chunk c is chunk c; for B and W their chunk 0 is the V's second chunk
                programs = [[((F, B, W)[cat], mb, chunk if cat == 0 else 1 - chunk) for cat, chunk, mb in st]
                            for st in sched]
                out.append(("zbv", _schedule(p, m, 2, programs, "zbv")))
    if "zbv_greedy" in mods:
        for setup in ("half", "min"):
            g = mods["zbv_greedy"].PipelineGraph(p, m, setup, f, b, w, 0)
            pattern = {"half": g.stable_pattern_v_half, "min": g.stable_pattern_v_min}[setup](p)
            for reorder in (True, False):
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        _, _, order = g.schedule_from_pattern([list(x) for x in pattern], m,
                                                              [f, f, b, b, w, w], do_reorder=reorder)
                except (AssertionError, IndexError, ValueError, KeyError):
                    continue
                programs = [[((F, B, W)[k // 2], mb, k % 2 if k < 2 else 1 - k % 2) for k, mb in st] for st in order]
                out.append((f"zbv_greedy-{setup}", _schedule(p, m, 2, programs, f"zbv_greedy-{setup}")))
    if "v_auto" in mods and 2 * limit >= 1:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                res = mods["v_auto"].schedule(p, m, (f, b, w, 0), min(2 * limit, 2 * p))
        except (AssertionError, IndexError, ValueError, KeyError, TypeError, AttributeError):
            res = None
        if res:
            programs = [[(n.type, n.minibatch, int(n.chunk)) for n in st] for st in res]
            out.append(("v_auto_schedule", _schedule(p, m, 2, programs, "v_auto_schedule")))
    return out


# --- the comparison ------------------------------------------------------------------------

def grid(ps, all_limits):
    for p in ps:
        vmin, vhalf = (p + 4) // 3, (p + 2) // 2
        for m in (2 * p, 3 * p, 4 * p):
            for fbw in COSTS:
                if all_limits:
                    for v in (2, 1):
                        for limit in range(vmin, 2 * p + 1):
                            yield p, m, fbw, v, limit
                else:
                    for limit in sorted({vmin, vhalf, p}):
                        yield p, m, fbw, 2, limit
                    for limit in (p, 3 * p // 2, 2 * p):
                        yield p, m, fbw, 1, limit


def ours(p, m, fbw, v, limit, op_time):
    bounded._PLAYED.items.clear()  # timed from scratch: nothing remembered from the rows before
    bounded._PLAYED.ops = 0
    v_pattern._REMEMBERED.clear()
    t = time.perf_counter()
    s = build("zb-auto", p, m, v, op_time, max_activations=limit)
    dt = time.perf_counter() - t
    assert peak_activations(s) <= limit + 1e-9
    return makespan_under(s, op_time), dt, s.params.get("origin", "")


def best_builtin(p, m, v, limit, op_time):
    best = (math.inf, "-")
    for name, builder in BUILDERS.items():
        if builder.searches or name in ("dualpipe",):
            continue
        if builder.chunks is not None and builder.chunks != v:
            continue
        try:
            s = build(name, p, m, None if builder.chunks else v, op_time)
        except Exception:
            continue
        if peak_activations(s) <= limit + 1e-9:
            best = min(best, (makespan_under(s, op_time), name))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sailsg", help="folder with sail-sg's scheduler sources (outside this repository)")
    parser.add_argument("--p", default="4,8", help="ranks, comma-separated (default 4,8)")
    parser.add_argument("--all-limits", action="store_true", help="every integer limit from V-Min's to 2p, both v")
    args = parser.parse_args()
    mods = load_theirs(args.sailsg) if args.sailsg else {}
    if not args.sailsg:
        print("no --sailsg DIR given: their code is not part of pipesched, so only our side is shown")
    elif not mods:
        print(f"--sailsg {args.sailsg}: none of their scheduler files loaded; only our side is shown")
    ps = [int(x) for x in args.p.split(",")]
    print("memory: peak activations, F to W, microbatches of one pipeline stage; time: makespan, free transfers")
    head = f"{'p':>2} {'m':>3} {'F,B,W':>6} {'v':>1} {'L':>3} | {'built-in':>8} {'(name)':<17}"
    if mods:
        head += f"| {'theirs':>7} {'(which)':<18}| {'ours':>7} {'ratio':>6} | {'search s':>8} (ours from)"
    else:
        head += f"| {'ours':>7} | {'search s':>8} (ours from)"
    print(head)
    worse = close = equal = better = 0
    worst: list[tuple[float, str]] = []
    times = []
    for p, m, fbw, v, limit in grid(ps, args.all_limits):
        op_time = uniform(*fbw).op_time_for(p)
        mine, dt, origin = ours(p, m, fbw, v, limit, op_time)
        times.append(dt)
        bi, bi_name = best_builtin(p, m, v, limit, op_time)
        row = f"{p:>2} {m:>3} {','.join(map(str, fbw)):>6} {v} {limit:>3} | {bi:>8.4g} {bi_name:<17}"
        if mods:
            cands = theirs_one_chunk(mods, p, m, fbw, limit) if v == 1 else theirs_v(mods, p, m, fbw, limit)
            timed = [(makespan_under(s, op_time), name) for name, s in cands if peak_activations(s) <= limit + 1e-9]
            th, th_name = min(timed, default=(math.inf, "none fits"))
            ratio = mine / th if th < math.inf else 0.0
            if ratio > 1.01:
                worse += 1
            elif ratio > 1 + 1e-9:
                close += 1
            elif ratio >= 1 - 1e-9:
                equal += 1
            else:
                better += 1
            worst.append((ratio, f"p={p} m={m} F,B,W={fbw} v={v} L={limit}"))
            row += f"| {th:>7.4g} {th_name:<18}| {mine:>7.4g} {ratio:>6.3f} | {dt:>8.3f} {origin}"
        else:
            row += f"| {mine:>7.4g} | {dt:>8.3f} {origin}"
        print(row, flush=True)
    print(f"zb-auto search time: median {sorted(times)[len(times) // 2]:.3f} s, max {max(times):.3f} s, "
          f"total {sum(times):.1f} s over {len(times)} configurations")
    if mods:
        n = worse + close + equal + better
        print(f"ours / theirs over {n} configurations: worse by > 1 %: {worse}, worse by <= 1 %: {close}, "
              f"equal: {equal}, better: {better}")
        worst.sort(reverse=True)
        print("largest ratios: " + "; ".join(f"{r:.3f} ({c})" for r, c in worst[:5]))
        print("smallest ratios: " + "; ".join(f"{r:.3f} ({c})" for r, c in worst[-3:]))


if __name__ == "__main__":
    main()
