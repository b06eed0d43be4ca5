"""Greedy list scheduling: build per-rank programs by playing the pipeline forward.

The zero-bubble schedules (Qi et al., ICLR 2024) are defined by a rule, not a table:
run a backward as soon as one is ready, otherwise a forward while memory allows,
otherwise fill the gap with a deferred weight gradient (W). This module plays that
rule out under given op durations (by default F = B = W per pipeline stage) and
records the order each rank ends up with. The result is an ordinary static schedule:
the simulator and the executor never see the rule, only the programs.

Every virtual stage runs its microbatches in increasing order for each op kind; the
rule chooses how a rank interleaves the kinds and its stages.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

from .graph import derive_edges
from .ir import B, BW, F, W, Schedule, ScheduleError, Task, VirtualStage
from .timeline import OpTime, fastest  # noqa: F401  (fastest: builders pick among candidates with it)


def unit_times(ranks: int) -> OpTime:
    """The default op durations: every op of a pipeline stage 1 (BW 2), split evenly over its chunks."""
    return lambda op, model_stage, num_model_stages: (2.0 if op == BW else 1.0) * ranks / num_model_stages


def equal_durations(op_time: OpTime, ops: tuple[str, ...], num_model_stages: int) -> bool:
    """True when every op in `ops` of every model stage takes the same time under `op_time`.

    Then a candidate's makespan is that time added up along its longest chain of ops, and
    each partial sum is computed the same way (previous end + the time), so makespans
    compare as the chains' lengths do, rounding included: an order at the lower bound on
    chain length is the fastest candidate, exactly as a search would find it."""
    first = op_time(ops[0], 0, num_model_stages)
    return all(op_time(op, k, num_model_stages) == first for op in ops for k in range(num_model_stages))


PREFERENCES = ("alternate", "backward", "forward")


@dataclass
class Rule:
    """How a rank picks its next op.

    memory_limit(rank): most activations a rank may hold, counted in microbatches'
        worth of one pipeline stage (a chunk of a v-chunk rank counts 1/v), from F to W.
    prefer: when both a forward and a backward are ready, "alternate" (1F1B),
        "backward" (drain first) or "forward" (fill first).
    split: B and W separate (zero bubble) or fused BW.
    """

    memory_limit: Callable[[int], float]
    prefer: str = "alternate"
    split: bool = True


def play(name: str, ranks: int, microbatches: int, stages: list[VirtualStage], paths: list[list[int]],
         microbatch_paths: list[int], rule: Rule, op_time: OpTime | None = None,
         params: dict | None = None) -> Schedule:
    """Build programs by greedy list scheduling under `rule` and `op_time`."""
    num_model = len(paths[0])
    op_time = op_time or unit_times(ranks)
    skeleton = Schedule(name, ranks, microbatches, stages, paths, microbatch_paths,
                        [[] for _ in range(ranks)], dict(params or {}))
    bwd = B if rule.split else BW
    tasks = [Task(op, mb, s) for mb in range(microbatches) for s in skeleton.path_of(mb)
             for op in ((F, B, W) if rule.split else (F, BW))]
    index = {t: i for i, t in enumerate(tasks)}
    deps: list[list[int]] = [[] for _ in tasks]
    consumers: list[list[int]] = [[] for _ in tasks]
    for e in derive_edges(skeleton, index):
        deps[e.dst].append(e.src)
        consumers[e.src].append(e.dst)
    missing = [len(d) for d in deps]
    ready_at = [0.0 if not d else math.nan for d in deps]
    duration = [op_time(t.op, stages[t.stage].model_stage, num_model) for t in tasks]
    if any(not (d >= 0 and math.isfinite(d)) for d in duration):
        raise ScheduleError("op durations used to build a schedule must be finite and >= 0")
    # A zero-length op would finish at the instant it starts, tying with the ops it
    # enables, and the play below cannot order ties; a tiny positive length keeps the
    # order the rule implies (`fastest` then times candidates with the real durations).
    positive = [d for d in duration if d > 0]
    tiny = min(positive) * 1e-6 if positive else 1.0
    duration = [d if d > 0 else tiny for d in duration]
    # per virtual stage: its microbatches in order, and the next one for F and backward
    stage_mbs: list[list[int]] = [[] for _ in stages]
    for mb in range(microbatches):
        for s in skeleton.path_of(mb):
            stage_mbs[s].append(mb)
    next_f = [0] * len(stages)
    next_b = [0] * len(stages)
    local = [[s for s, st in enumerate(stages) if st.rank == r and stage_mbs[s]] for r in range(ranks)]
    share = [ranks / num_model] * len(stages)  # activation of one chunk, in pipeline-stage units
    held = [0.0] * ranks
    limit = [rule.memory_limit(r) for r in range(ranks)]
    pending_w: list[list[int]] = [[] for _ in range(ranks)]
    remaining = [sum(len(stage_mbs[s]) for s in local[r]) * (3 if rule.split else 2) for r in range(ranks)]
    free = [0.0] * ranks
    wake = [0.0] * ranks
    heap = [(0.0, r) for r in range(ranks) if remaining[r]]
    heapq.heapify(heap)
    programs: list[list[Task]] = [[] for _ in range(ranks)]

    def candidate(s: int, op: str) -> int | None:
        pointer = next_f if op == F else next_b
        if pointer[s] < len(stage_mbs[s]):
            return index[Task(op, stage_mbs[s][pointer[s]], s)]
        return None

    last_kind = [B] * ranks  # so that a rank starts with a forward

    def pick(r: int, t: float, op: str) -> tuple[int | None, float]:
        """The highest-priority ready `op` task of rank r at t, and the soonest other ready time."""
        soonest, best = math.inf, None
        for s in local[r]:
            c = candidate(s, op)
            if c is None or missing[c]:
                continue
            if op == F and held[r] + share[s] > limit[r] + 1e-9 and held[r] > 0:
                continue
            if ready_at[c] <= t:
                key = (tasks[c].mb, -stages[s].model_stage)
                if best is None or key < best[0]:
                    best = (key, c)
            else:
                soonest = min(soonest, ready_at[c])
        return (best[1] if best else None), soonest

    def choose(r: int, t: float) -> int | float:
        """A task to run at t, or the next time something may be ready (inf: unknown).
        When a forward and a backward are both ready the rule's preference decides; a
        deferred W fills the time when neither is."""
        f, f_next = pick(r, t, F)
        b, b_next = pick(r, t, bwd)
        if f is not None and b is not None:
            if rule.prefer == "alternate":
                return b if last_kind[r] == F else f
            return b if rule.prefer == "backward" else f
        if f is not None or b is not None:
            return f if f is not None else b
        if pending_w[r]:
            return pending_w[r].pop(0)
        return min(f_next, b_next)

    while heap:
        t, r = heapq.heappop(heap)
        if t != wake[r] or not remaining[r]:
            continue  # stale entry
        picked = choose(r, t)
        if isinstance(picked, float):
            wake[r] = picked
            if picked < math.inf:
                heapq.heappush(heap, (picked, r))
            continue
        task = tasks[picked]
        start = max(t, ready_at[picked])
        end = start + duration[picked]
        programs[r].append(task)
        remaining[r] -= 1
        if task.op != W:
            last_kind[r] = task.op
        if task.op == F:
            next_f[task.stage] += 1
            held[r] += share[task.stage]
        elif task.op in (B, BW):
            next_b[task.stage] += 1
            if task.op == BW:
                held[r] -= share[task.stage]
            else:
                pending_w[r].append(index[Task(W, task.mb, task.stage)])
        else:
            held[r] -= share[task.stage]
        free[r] = wake[r] = end
        if remaining[r]:
            heapq.heappush(heap, (end, r))
        for c in consumers[picked]:
            missing[c] -= 1
            ready_at[c] = end if math.isnan(ready_at[c]) else max(ready_at[c], end)
            q = stages[tasks[c].stage].rank
            if not missing[c] and q != r and remaining[q] and ready_at[c] < wake[q]:
                wake[q] = max(free[q], ready_at[c])
                heapq.heappush(heap, (wake[q], q))
    stuck = [r for r in range(ranks) if remaining[r]]
    if stuck:
        raise ScheduleError(f"{name}: rank {stuck[0]} cannot proceed under its memory limit "
                            f"({limit[stuck[0]]:g} microbatches); raise the limit")
    skeleton.programs = programs  # type: ignore[assignment]
    return skeleton
