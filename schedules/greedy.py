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
from collections import deque
from dataclasses import dataclass
from typing import Callable

from .graph import derive_edges
from .ir import B, BW, F, W, Schedule, ScheduleError, Task, VirtualStage
from .timeline import OpTime


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
    """Build programs by greedy list scheduling under `rule` and `op_time` (seconds)."""
    schedule = Schedule(name, ranks, microbatches, stages, paths, microbatch_paths,
                        [[] for _ in range(ranks)], dict(params or {}))
    tasks = _Tasks(schedule, rule.split, op_time or unit_times(ranks))
    schedule.programs = _Playout(schedule, tasks, rule).run()  # type: ignore[assignment]
    return schedule


class _Tasks:
    """Every op the schedule will run, numbered microbatch by microbatch along its path
    (F, B, W or F, BW at each stage), with its inputs, consumers and duration."""

    def __init__(self, schedule: Schedule, split: bool, op_time: OpTime):
        ops = (F, B, W) if split else (F, BW)
        self.tasks = [Task(op, mb, s) for mb in range(schedule.microbatches) for s in schedule.path_of(mb)
                      for op in ops]
        self.index = {t: i for i, t in enumerate(self.tasks)}
        self.consumers: list[list[int]] = [[] for _ in self.tasks]
        self.missing = [0] * len(self.tasks)  # inputs not yet produced
        for e in derive_edges(schedule, self.index):
            self.consumers[e.src].append(e.dst)
            self.missing[e.dst] += 1
        self.ready_at = [0.0 if not n else math.nan for n in self.missing]  # when its inputs are all there
        model = [st.model_stage for st in schedule.stages]
        self.rank = [schedule.stages[t.stage].rank for t in self.tasks]
        num_model = schedule.num_model_stages
        duration = [op_time(t.op, model[t.stage], num_model) for t in self.tasks]
        if any(not (d >= 0 and math.isfinite(d)) for d in duration):
            raise ScheduleError("op durations used to build a schedule must be finite and >= 0")
        # A zero-length op would finish at the instant it starts, tying with the ops it
        # enables, and the play cannot order ties; a tiny positive length keeps the order
        # the rule implies (`fastest` then times candidates with the real durations).
        positive = [d for d in duration if d > 0]
        tiny = min(positive) * 1e-6 if positive else 1.0
        self.duration = [d if d > 0 else tiny for d in duration]
        # priority among ready ops of one kind: the lowest microbatch, then the deepest model stage
        self.priority = [t.mb * num_model + (num_model - 1 - model[t.stage]) for t in self.tasks]


@dataclass
class _Rank:
    """One rank during the play-out."""

    stages: list[int]        # its virtual stages that run some microbatch
    limit: float             # activations it may hold (pipeline-stage microbatches)
    remaining: int           # ops still to run
    held: float = 0.0        # activations held, F to W (or BW)
    free: float = 0.0        # when its current op ends
    wake: float = 0.0        # when it next looks for work (its one live heap entry)
    last_kind: str = B       # kind of its last F or backward; B so that it starts with a forward


class _Playout:
    """Greedy list scheduling: each rank, whenever it is free, runs the op its rule
    picks among those whose inputs are ready (in time order over all ranks)."""

    def __init__(self, schedule: Schedule, tasks: _Tasks, rule: Rule):
        self.name, self.tasks, self.rule = schedule.name, tasks, rule
        self.backward = B if rule.split else BW
        num_model = schedule.num_model_stages
        n_stages = len(schedule.stages)
        # per virtual stage, its F and backward task ids in microbatch order, and the next of each
        self.queue = {F: [[] for _ in range(n_stages)], self.backward: [[] for _ in range(n_stages)]}
        for i, t in enumerate(tasks.tasks):
            if t.op in self.queue:
                self.queue[t.op][t.stage].append(i)
        self.next = {F: [0] * n_stages, self.backward: [0] * n_stages}
        self.share = schedule.ranks / num_model  # activation of one chunk, in pipeline-stage units
        per_stage = 3 if rule.split else 2  # ops per microbatch and stage
        self.ranks = []
        for r in range(schedule.ranks):
            local = [s for s, st in enumerate(schedule.stages) if st.rank == r and self.queue[F][s]]
            self.ranks.append(_Rank(local, rule.memory_limit(r), sum(len(self.queue[F][s]) for s in local) * per_stage))
        self.pending_w: list[deque[int]] = [deque() for _ in self.ranks]
        self.programs: list[list[Task]] = [[] for _ in self.ranks]

    def ready(self, rank: _Rank, t: float, op: str) -> tuple[int | None, float]:
        """The highest-priority `op` task of `rank` whose inputs are there at t, and the
        soonest time another one's will be (inf: not known yet)."""
        tasks, queue, nxt = self.tasks, self.queue[op], self.next[op]
        missing, ready_at, priority = tasks.missing, tasks.ready_at, tasks.priority
        soonest, best, best_key = math.inf, None, None
        for s in rank.stages:
            if nxt[s] >= len(queue[s]):
                continue
            c = queue[s][nxt[s]]
            if missing[c]:
                continue
            if op == F and rank.held + self.share > rank.limit + 1e-9 and rank.held > 0:
                continue
            if ready_at[c] <= t:
                if best is None or priority[c] < best_key:
                    best, best_key = c, priority[c]
            elif ready_at[c] < soonest:
                soonest = ready_at[c]
        return best, soonest

    def choose(self, r: int, t: float) -> int | float:
        """A task for rank r to run at t, or the next time something may be ready (inf:
        unknown). When a forward and a backward are both ready the rule's preference
        decides; a deferred W fills the time when neither is."""
        rank = self.ranks[r]
        f, f_next = self.ready(rank, t, F)
        b, b_next = self.ready(rank, t, self.backward)
        if f is not None and b is not None:
            prefer = self.rule.prefer
            if prefer == "alternate":
                return b if rank.last_kind == F else f
            return b if prefer == "backward" else f
        if f is not None or b is not None:
            return f if f is not None else b
        if self.pending_w[r]:
            return self.pending_w[r].popleft()
        return min(f_next, b_next)

    def start(self, r: int, c: int, t: float, heap: list) -> None:
        """Rank r runs task c from max(t, its inputs' arrival); its consumers learn when
        their input is there, and a rank idle for lack of it is woken."""
        tasks, rank = self.tasks, self.ranks[r]
        task = tasks.tasks[c]
        end = max(t, tasks.ready_at[c]) + tasks.duration[c]
        self.programs[r].append(task)
        rank.remaining -= 1
        if task.op != W:
            rank.last_kind = task.op
        if task.op == F:
            self.next[F][task.stage] += 1
            rank.held += self.share
        elif task.op == W:
            rank.held -= self.share
        else:
            self.next[self.backward][task.stage] += 1
            if task.op == BW:
                rank.held -= self.share
            else:
                self.pending_w[r].append(c + 1)  # tasks run F, B, W at each stage: B's W is next
        rank.free = rank.wake = end
        if rank.remaining:
            heapq.heappush(heap, (end, r))
        missing, ready_at = tasks.missing, tasks.ready_at
        for c2 in tasks.consumers[c]:
            missing[c2] -= 1
            ready_at[c2] = end if math.isnan(ready_at[c2]) else max(ready_at[c2], end)
            q = tasks.rank[c2]
            other = self.ranks[q]
            if not missing[c2] and q != r and other.remaining and ready_at[c2] < other.wake:
                other.wake = max(other.free, ready_at[c2])
                heapq.heappush(heap, (other.wake, q))

    def run(self) -> list[list[Task]]:
        heap = [(0.0, r) for r, rank in enumerate(self.ranks) if rank.remaining]
        heapq.heapify(heap)
        while heap:
            t, r = heapq.heappop(heap)
            rank = self.ranks[r]
            if t != rank.wake or not rank.remaining:
                continue  # stale entry
            picked = self.choose(r, t)
            if isinstance(picked, float):
                rank.wake = picked
                if picked < math.inf:
                    heapq.heappush(heap, (picked, r))
                continue
            self.start(r, picked, t, heap)
        stuck = [r for r, rank in enumerate(self.ranks) if rank.remaining]
        if stuck:
            raise ScheduleError(f"{self.name}: rank {stuck[0]} cannot proceed under its memory limit "
                                f"({self.ranks[stuck[0]].limit:g} microbatches); raise the limit")
        return self.programs
