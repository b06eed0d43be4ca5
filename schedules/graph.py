"""Dependencies derived from microbatch paths, and the compiled task graph.

Rules (s_k is the k-th virtual stage on a microbatch's path):
  F(mb, s_k)       after F(mb, s_{k-1})                  (activation)
  B|BW(mb, s_k)    after F(mb, s_k), or after R(mb, s_k)  (local)
                   when the stage recomputes
  R(mb, s_k)       after F(mb, s_k)                      (local: F kept the input)
                   and after B|BW(mb, s_{k+1})           (gradient)
  W(mb, s)         after B(mb, s)                        (local)
An edge between virtual stages on different ranks is a point-to-point transfer; on the
same rank (a V-shape turn) it is a local hand-over.

`TaskGraph` is the compact form every evaluator walks: integer task and unit ids, one
unit per program element (an overlapped pair is one unit), and a topological order of
units that `schedules.validate` proves exists.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .ir import B, BW, F, OPS, R, W, Overlap, Schedule, Task, unit_tasks

if TYPE_CHECKING:
    import networkx as nx

    from .waves import Waves

LOCAL, ACTIVATION, GRADIENT = 0, 1, 2
EDGE_KINDS = ("local", "activation", "gradient")


class Edge(NamedTuple):
    """`dst` task needs `src` task's output. `boundary` is the model stage whose output
    (activation) or input (gradient) crosses; bytes are looked up by it."""

    src: int
    dst: int
    kind: int
    boundary: int


@dataclass
class TaskGraph:
    """A schedule compiled for evaluation (`check_schedule` / `schedules.validate`
    returns it, validated). Ids are list positions:

    schedule: the Schedule it was compiled from.
    tasks: every op of every microbatch (Task: op, mb, virtual stage); index: Task -> id.
    units: the program elements as tuples of task ids (an overlapped pair is one unit
        of two tasks); task_unit: per task, its unit; unit_rank: per unit, its rank;
        rank_units: per rank, its units in program order.
    edges: data dependencies (`Edge`: src task, dst task, kind LOCAL / ACTIVATION /
        GRADIENT, the model-stage boundary whose bytes cross).
    topo_units: a topological order of the units (filled by validation).
    waves: the units in waves (`schedules.waves`), computed when first needed.
    No times or sizes: the cost model adds those when simulating.
    """

    schedule: Schedule
    tasks: list[Task]
    index: dict[Task, int]
    task_unit: list[int]
    units: list[tuple[int, ...]]
    unit_rank: list[int]
    rank_units: list[list[int]]
    edges: list[Edge]
    topo_units: list[int]          # filled by validation; empty until then
    _columns: dict | None = field(default=None, repr=False)
    waves: Waves | None = field(default=None, repr=False)  # see schedules.timeline.graph_waves
    _inputs: list[list[int]] | None = field(default=None, repr=False)
    _outputs: list[list[int]] | None = field(default=None, repr=False)

    def columns(self) -> dict[str, np.ndarray]:
        """Per-task and per-edge numpy columns, for vectorised consumers (computed once).
        Tasks: op (index into OPS), mb, stage, unit, rank, paired; edges: src, dst, kind,
        boundary. Task ids run unit by unit, so a unit's tasks are consecutive."""
        if self._columns is None:
            op_index = {op: i for i, op in enumerate(OPS)}
            task_unit = np.asarray(self.task_unit, dtype=np.int64)
            unit_size = np.asarray([len(m) for m in self.units], dtype=np.int64)
            # one flat pass over the edge tuples: np.asarray on a list of tuples is 5x slower
            edges = np.fromiter(chain.from_iterable(self.edges), np.int64, 4 * len(self.edges)).reshape(-1, 4)
            self._columns = {
                "op": np.asarray([op_index[t.op] for t in self.tasks], dtype=np.int8),
                "mb": np.asarray([t.mb for t in self.tasks], dtype=np.int32),
                "stage": np.asarray([t.stage for t in self.tasks], dtype=np.int32),
                "unit": task_unit,
                "rank": np.asarray(self.unit_rank, dtype=np.int32)[task_unit] if len(task_unit) else np.zeros(0, np.int32),
                "paired": unit_size[task_unit] == 2 if len(task_unit) else np.zeros(0, bool),
                "edge_src": edges[:, 0], "edge_dst": edges[:, 1], "edge_kind": edges[:, 2],
                "edge_boundary": edges[:, 3],
            }
        return self._columns

    @property
    def task_inputs(self) -> list[list[int]]:
        """Edge ids into each task (built on first use: the exact engine never needs them)."""
        if self._inputs is None:
            self._inputs, self._outputs = _edge_lists(len(self.tasks), self.edges)
        return self._inputs

    @property
    def task_outputs(self) -> list[list[int]]:
        """Edge ids out of each task, in edge order."""
        if self._outputs is None:
            self._inputs, self._outputs = _edge_lists(len(self.tasks), self.edges)
        return self._outputs

    @property
    def transfers(self) -> list[int]:
        """Edge ids that cross ranks, in no particular order."""
        return [i for i, e in enumerate(self.edges) if e.kind != LOCAL]

    def edge_ranks(self, edge_id: int) -> tuple[int, int]:
        e = self.edges[edge_id]
        return self.unit_rank[self.task_unit[e.src]], self.unit_rank[self.task_unit[e.dst]]


def derive_edges(schedule: Schedule, index: dict[Task, int]) -> list[Edge]:
    """All data dependencies of a structurally valid schedule, from its paths.

    `index` is looked up with plain (op, mb, stage) tuples, which hash and compare equal
    to the Task keys: building a Task per lookup was a third of the time at p=64, m=256."""
    rank = [st.rank for st in schedule.stages]
    model = [st.model_stage for st in schedule.stages]
    edges: list[Edge] = []
    recomputes = any(key[0] == R for key in index)
    add, new = edges.append, tuple.__new__  # new(Edge, ...) skips the NamedTuple's Python-level constructor
    for mb in range(schedule.microbatches):
        path = schedule.path_of(mb)
        last = len(path) - 1
        fwd = [index[(F, mb, s)] for s in path]
        bwd = [index.get((B, mb, s)) for s in path]
        split = [b is not None for b in bwd]
        bwd = [b if b is not None else index[(BW, mb, s)] for b, s in zip(bwd, path)]
        rec = [index.get((R, mb, s)) for s in path] if recomputes else [None] * len(path)
        for k, s in enumerate(path):
            ms = model[s]
            if k > 0:
                prev = path[k - 1]
                add(new(Edge, (fwd[k - 1], fwd[k], LOCAL if rank[prev] == rank[s] else ACTIVATION, model[prev])))
            if rec[k] is None:
                add(new(Edge, (fwd[k], bwd[k], LOCAL, ms)))
            else:  # the backward needs the recomputed forward, which needs F's kept input
                add(new(Edge, (fwd[k], rec[k], LOCAL, ms)))
                add(new(Edge, (rec[k], bwd[k], LOCAL, ms)))
            if k < last:
                add(new(Edge, (bwd[k + 1], bwd[k], LOCAL if rank[path[k + 1]] == rank[s] else GRADIENT, ms)))
            if split[k]:
                add(new(Edge, (bwd[k], index[(W, mb, s)], LOCAL, ms)))
    return edges


def build_graph(schedule: Schedule) -> TaskGraph:
    """Compile a structurally valid schedule (see `validate.check_structure`)."""
    tasks: list[Task] = []
    task_unit: list[int] = []
    units: list[tuple[int, ...]] = []
    unit_rank: list[int] = []
    rank_units: list[list[int]] = []
    for rank, program in enumerate(schedule.programs):
        if not any(isinstance(item, Overlap) for item in program):  # one task per unit: extend in bulk
            first_unit, first_task, n = len(units), len(tasks), len(program)
            tasks.extend(program)
            task_unit.extend(range(first_unit, first_unit + n))
            units.extend((t,) for t in range(first_task, first_task + n))
            unit_rank.extend([rank] * n)
            rank_units.append(list(range(first_unit, first_unit + n)))
            continue
        ids = []
        for item in program:
            members = []
            for task in unit_tasks(item):
                members.append(len(tasks))
                tasks.append(task)
                task_unit.append(len(units))
            ids.append(len(units))
            units.append(tuple(members))
            unit_rank.append(rank)
        rank_units.append(ids)
    index = {t: i for i, t in enumerate(tasks)}
    return TaskGraph(schedule, tasks, index, task_unit, units, unit_rank, rank_units, derive_edges(schedule, index), [])


def _edge_lists(n_tasks: int, edges: list[Edge]) -> tuple[list[list[int]], list[list[int]]]:
    """Per task, the ids of the edges into it and out of it, in edge order."""
    inputs: list[list[int]] = [[] for _ in range(n_tasks)]
    outputs: list[list[int]] = [[] for _ in range(n_tasks)]
    for i, e in enumerate(edges):
        inputs[e.dst].append(i)
        outputs[e.src].append(i)
    return inputs, outputs


def to_networkx(graph: TaskGraph) -> nx.DiGraph:
    """Tasks as nodes; data edges (`kind`: local/activation/gradient) and program-order
    edges (`kind`: program) between consecutive units of a rank. A data edge that is
    also program order keeps its data kind and gets `program=True`."""
    import networkx as nx  # here, not at the top: importing it costs more than compiling a graph

    g = nx.DiGraph()
    for i, task in enumerate(graph.tasks):
        g.add_node(task, rank=graph.unit_rank[graph.task_unit[i]], unit=graph.task_unit[i])
    for e in graph.edges:
        g.add_edge(graph.tasks[e.src], graph.tasks[e.dst], kind=EDGE_KINDS[e.kind],
                   boundary=e.boundary)
    for ids in graph.rank_units:
        for a, b in zip(ids, ids[1:]):
            for ta in graph.units[a]:
                for tb in graph.units[b]:
                    u, v = graph.tasks[ta], graph.tasks[tb]
                    if g.has_edge(u, v):
                        g.edges[u, v]["program"] = True
                    else:
                        g.add_edge(u, v, kind="program", program=True)
    return g


def unit_label(graph: TaskGraph, unit: int) -> str:
    members = [graph.tasks[t] for t in graph.units[unit]]
    return str(Overlap(*members)) if len(members) == 2 else str(members[0])
