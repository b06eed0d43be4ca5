"""The schedule IR: ops on virtual stages, microbatch paths and per-rank programs.

A schedule is data, not code: every consumer (validation, simulator, executor, figures,
file format) reads the same `Schedule`. Dependencies are never stored here; they are
derived from the paths by `schedules.graph`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Union

from .numbers import is_int

F, B, W, BW = "F", "B", "W", "BW"
R = "R"  # recompute-forward: re-runs F with autograd right before the backward that needs it
OPS = (F, B, W, BW, R)  # R last, so the other ops keep their indices


class ScheduleError(ValueError):
    """A schedule or its arguments violate a constraint; the message names it."""


class Task(NamedTuple):
    """One op of one microbatch on one virtual stage (an index into `Schedule.stages`)."""

    op: str
    mb: int
    stage: int

    def __str__(self) -> str:
        return f"{self.op}{self.mb}@{self.stage}"


class Overlap(NamedTuple):
    """Two ops that a rank runs as one unit (DualPipe's overlapped F&B pair)."""

    first: Task
    second: Task

    def __str__(self) -> str:
        return f"{self.first}+{self.second}"


ProgramItem = Union[Task, Overlap]


def unit_tasks(item: ProgramItem) -> tuple[Task, ...]:
    """The tasks of one program element, in the order the rank issues them."""
    return tuple(item) if isinstance(item, Overlap) else (item,)


@dataclass(frozen=True)
class VirtualStage:
    """One chunk of the model (`model_stage`) placed on one rank."""

    rank: int
    model_stage: int


@dataclass
class Schedule:
    """A pipeline schedule as a task graph.

    - `stages`: the virtual stages; a task's `stage` indexes this list.
    - `paths`: virtual-stage sequences; each visits model stages 0..S-1 in order.
    - `microbatch_paths`: which path each microbatch follows.
    - `programs`: one list per rank, the rank's ops in execution order.
    """

    name: str
    ranks: int
    microbatches: int
    stages: list[VirtualStage]
    paths: list[list[int]]
    microbatch_paths: list[int]
    programs: list[list[ProgramItem]]
    # builder parameters kept for display only (e.g. {"v": 2}); never read by consumers
    params: dict = field(default_factory=dict, compare=False)

    @property
    def num_model_stages(self) -> int:
        return len(self.paths[0]) if self.paths else 0

    def path_of(self, mb: int) -> list[int]:
        return self.paths[self.microbatch_paths[mb]]

    def stages_of_rank(self, rank: int) -> list[int]:
        """The virtual stages `rank` holds, in index order. One pass over the stages: for
        every rank at once use `stages_by_rank` (linear, not quadratic)."""
        return [i for i, s in enumerate(self.stages) if s.rank == rank]

    def stages_by_rank(self) -> list[list[int]]:
        """`stages_of_rank(r)` for every rank r in 0..ranks-1, in one pass. Stages placed
        outside that range (an invalid schedule) are left out."""
        held: list[list[int]] = [[] for _ in range(self.ranks)]
        for i, s in enumerate(self.stages):
            if 0 <= s.rank < self.ranks:
                held[s.rank].append(i)
        return held

    def tasks(self) -> Iterator[Task]:
        for program in self.programs:
            for item in program:
                yield from unit_tasks(item)


def uniform_paths(stages: list[VirtualStage], microbatches: int) -> tuple[list[list[int]], list[int]]:
    """One path through the virtual stages ordered by model stage, followed by every microbatch."""
    order = sorted(range(len(stages)), key=lambda i: stages[i].model_stage)
    return [order], [0] * microbatches


def looped_stages(ranks: int, chunks: int) -> list[VirtualStage]:
    """Megatron placement: model stage k on rank k mod p (chunk k // p)."""
    return [VirtualStage(k % ranks, k) for k in range(ranks * chunks)]


def v_stages(ranks: int) -> list[VirtualStage]:
    """V placement: rank r holds model stages r and 2p-1-r, so the loss is on rank 0."""
    return [VirtualStage(k if k < ranks else 2 * ranks - 1 - k, k) for k in range(2 * ranks)]


def check_positive(name: str, **values: int) -> None:
    """Raise ScheduleError unless every value is an int >= 1."""
    for key, value in values.items():
        if not is_int(value) or value < 1:
            raise ScheduleError(f"{name} needs {key} >= 1, got {value!r}")
