"""One rank walking its program of a validated task graph, for one step at a time.

Every input of a task is an edge of the graph: a remote edge is a receive (posted ahead,
see `Posting`), a local edge a hand-over in `self.local` (the forward state to its
backward, B's kept state to W, or a tensor at a V turn). Outputs go the same way:
right after an op, each remote out-edge is sent and each local one stored. Nothing is
derived from the schedule except through `TaskGraph`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from pipesched.schedules.graph import ACTIVATION, LOCAL, TaskGraph
from pipesched.schedules.ir import B, BW, F, R, W, Task
from pipesched.simulator.posting import receive_posts

from . import replicas
from .clock import CpuTimer, CudaTimer, now
from .comm import GlooTransport, NcclTransport, Transfer, link_groups
from .data_parallel import GradientSync, Layout, dp_groups, last_weight_tasks
from .memory import MemoryLedger
from .models import PipelineModel, TensorSpec
from .stage import StageModule, held_bytes


@dataclass
class RankStep:
    """What one rank measured in one step (host clock seconds; picklable)."""

    rank: int
    start: float
    end: float
    compute: list[tuple[int, float, float]]            # (task id, start, end)
    transfers: list[tuple[str, int, int, float, float, float]]  # (lane, edge, peer, start, end, taken)
    memory: tuple[list[float], list[int]]
    losses: dict[int, float]                           # microbatch -> scaled loss (last model stage)
    host_op_time: float                                # seconds the host spent inside op calls and SGD steps
    host_wait_time: float                              # seconds blocked on receives, final sends, all-reduces
    forward_bytes: dict[int, list[int]] = field(default_factory=dict)  # model stage -> bytes saved per F
    kept_bytes: dict[int, list[int]] = field(default_factory=dict)     # model stage -> bytes B kept for W
    allreduce: list[tuple[int, int, float, float]] = field(default_factory=list)  # (model stage, bucket, start, end)
    optimizer: list[tuple[int, float, float]] = field(default_factory=list)       # (model stage, start, end)


class Posting:
    """When each receive is posted: before unit i the rank posts `before[i]`.

    gloo matches by tag, so each receive is posted ahead of its op by the rule of
    `simulator.posting` (at least `lookahead` units ahead, earlier when the sender will
    produce it sooner; all at the start when lookahead < 0). NCCL matches a link's messages in order, so a receive
    is posted just before its unit together with any earlier message of its link in
    the sender's order (which keeps NCCL's per-link streams free of cycles)."""

    def __init__(self, graph: TaskGraph, rank: int, recv_edges: list[list[int]], lookahead: int, in_order: bool):
        n = len(recv_edges)
        self.before: list[list[int]] = [[] for _ in range(n)]
        if not in_order:
            posts = receive_posts(graph, lookahead)  # the rule the simulator models too
            for edges in recv_edges:
                for e in edges:
                    self.before[posts[e]].append(e)
            return
        sender_order = {e: k for k, e in enumerate(
            e for r in range(graph.schedule.ranks) for u in graph.rank_units[r] for t in graph.units[u]
            for e in graph.task_outputs[t] if graph.edges[e].kind != LOCAL and graph.edge_ranks(e) == (r, rank))}
        by_link: dict[int, list[int]] = {}
        for e in sorted(sender_order, key=sender_order.get):
            by_link.setdefault(graph.edge_ranks(e)[0], []).append(e)
        posted = {src: 0 for src in by_link}
        for i, edges in enumerate(recv_edges):
            for e in edges:
                src = graph.edge_ranks(e)[0]
                link = by_link[src]
                upto = link.index(e) + 1
                if upto > posted[src]:
                    self.before[i].extend(link[posted[src]:upto])
                    posted[src] = upto


class RankRuntime:
    """Rank `rank`'s share of a schedule: its stage modules, transfers and program.

    With data parallelism (`layout` of more than one replica, see executor.data_parallel)
    `rank` is the pipeline rank within the replica, transfers go to the replica's own
    ranks, and each model stage's gradients are all-reduced over the DP group once its
    last W or BW on this rank ends (buckets of `bucket_bytes`), then stepped by SGD (`lr`)."""

    def __init__(self, graph: TaskGraph, rank: int, model: PipelineModel, specs: list[TensorSpec],
                 backend: str, device: torch.device, timeout: float, lookahead: int = 2,
                 layout: Layout | None = None, bucket_bytes: float | None = None, lr: float = 0.0):
        sched = graph.schedule
        layout = layout or Layout(rank, sched.ranks, 1)
        self.offset = offset = layout.offset
        self.graph, self.rank, self.model, self.device, self.timeout = graph, rank, model, device, timeout
        self.timer = CudaTimer(device) if device.type == "cuda" else CpuTimer()
        own = sorted({sched.stages[s].model_stage for s in sched.stages_of_rank(rank)})
        for k in own:
            model.stages[k].to(device)
        params = [p for k in own for p in model.stages[k].parameters()]
        self.ledger = MemoryLedger(now, params)
        self.modules = {k: StageModule(model.stages[k], k, sched.num_model_stages, model.loss_fn, model.scale,
                                       self.ledger) for k in own}
        self.shared = replicas.shared_groups(replicas.holders(sched), model.stages)
        self.units = [graph.units[u] for u in graph.rank_units[rank]]
        self.transfers: dict[int, Transfer] = {}
        for e in range(len(graph.edges)):
            edge = graph.edges[e]
            src, dst = graph.edge_ranks(e)
            if edge.kind != LOCAL and rank in (src, dst):
                kind = "activation" if edge.kind == ACTIVATION else "gradient"
                self.transfers[e] = Transfer(e, offset + (dst if src == rank else src), graph.tasks[edge.src],
                                             graph.tasks[edge.dst], kind)
        self.specs = {e: specs[graph.edges[e].boundary] for e in self.transfers}
        recv_edges = [[e for t in unit for e in graph.task_inputs[t] if e in self.transfers] for unit in self.units]
        nccl = backend == "nccl"
        self.posting = Posting(graph, rank, recv_edges, 0 if nccl else lookahead, in_order=nccl)
        p = sched.ranks
        links = [(q * p + a, q * p + b) for q in range(layout.replicas) for a, b in map(graph.edge_ranks, graph.transfers)]
        groups = None if nccl else link_groups(links)  # collective: every rank builds the same groups
        transport = NcclTransport if nccl else GlooTransport
        self.transport = transport(offset + rank, timeout, self.ledger, device, len(self.transfers), groups)
        self.sync: GradientSync | None = None
        self.last_weight: dict[int, int] = {}  # task id -> the model stage whose last W or BW it is
        if layout.replicas > 1:
            group = dp_groups(p, layout.replicas)[rank]  # collective too, after the link groups everywhere
            self.sync = GradientSync(layout.rank, {k: sm.module for k, sm in self.modules.items()}, group,
                                     bucket_bytes, timeout, lr)
            self.last_weight = {t: k for k, t in last_weight_tasks(graph, rank).items()}
        self.inputs = [x.to(device) for x in model.inputs]
        self.targets = [y.to(device) for y in model.targets]
        self.local: dict[int, Any] = {}
        self.local_keys: dict[int, int | None] = {}
        self.arrived: dict[int, Any] = {}  # received ahead of their op (the inputs of a pair)
        # (microbatch, virtual stage) whose F runs without a graph: an R re-runs it before the backward
        self.recomputed = {(t.mb, t.stage) for t in graph.tasks if t.op == R and sched.stages[t.stage].rank == rank}
        self.steps_taken = 0

    # --- one step ---------------------------------------------------------------------

    def step(self) -> RankStep:
        """Run the rank's program once: gradients of this step only (zeroed first), then
        summed over the ranks holding each parameter (replicas, tied weights). gloo tags
        alternate between two ranges from step to step (edge id, edge id + edges), so
        without a barrier between steps a neighbour's next-step message cannot be taken
        for this step's (NCCL matches each link's messages in posting order anyway)."""
        if isinstance(self.transport, GlooTransport):
            self.transport.tag_offset = (self.steps_taken % 2) * len(self.graph.edges)
        self.steps_taken += 1
        for sm in self.modules.values():
            for p in sm.params:
                p.grad = None
        self.ledger.restart()
        if isinstance(self.timer, CudaTimer):
            self.timer.start_step()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.op_time = self.wait_time = 0.0
        self.forward_bytes, self.kept_bytes = {}, {}
        start = now()
        marks, losses = self._walk()
        waited = now()  # the all-reduces' tail is waiting, the SGD step op time: not host overhead
        order = self.sync.finish() if self.sync is not None else []
        replicas.sum_shared_grads(self.rank, self.shared, self.model.stages, len(self.graph.edges), self.timeout,
                                  self.device, self.offset)
        stepped = now()
        self.wait_time += stepped - waited
        if self.sync is not None:
            self.sync.step(order)
        self.op_time += now() - stepped
        self.timer.sync()
        end = now()
        compute = [(t, self.timer.seconds(a), self.timer.seconds(b)) for t, a, b in marks]
        transfers = [(d.lane, d.transfer.edge, d.transfer.peer - self.offset, d.start, d.end, d.taken)
                     for d in self.transport.done]
        self.transport.done.clear()
        memory = (list(self.ledger.times), list(self.ledger.levels))
        allreduce, optimizer = self.sync.take_spans() if self.sync is not None else ([], [])
        return RankStep(self.rank, start, end, compute, transfers, memory, {mb: float(v) for mb, v in losses.items()},
                        self.op_time, self.wait_time, self.forward_bytes, self.kept_bytes, allreduce, optimizer)

    def _walk(self) -> tuple[list, dict[int, Tensor]]:
        """The program, unit by unit, then the wait for the last sends."""
        marks: list = []
        losses: dict[int, Tensor] = {}
        for i, unit in enumerate(self.units):
            self._post(self.posting.before[i])
            self.transport.check()
            if len(unit) > 1:  # a pair runs as one unit: every input first, as DualPipe's F&B does
                for t in unit:
                    for e in self.graph.task_inputs[t]:
                        if e in self.transfers:
                            self.arrived[e] = self._take(e)
            for t in unit:
                marks.append(self._run(t, losses))
                if self.sync is not None and t in self.last_weight:
                    self.sync.start(self.last_weight[t])
        waited = now()
        self.transport.drain()
        self.wait_time += now() - waited
        if self.local:
            raise RuntimeError(f"rank {self.rank}: hand-overs left after the step: {sorted(self.local)} (executor bug)")
        return marks, losses

    def close(self) -> None:
        self.transport.close()
        if self.sync is not None:
            self.sync.close()

    def _post(self, edges: list[int]) -> None:
        if edges:
            self.transport.post_recvs([(self.transfers[e], self.specs[e]) for e in edges])

    def _take(self, e: int) -> Any:
        if e in self.arrived:
            return self.arrived.pop(e)
        if e in self.transfers:
            waited = now()
            value = self.transport.take(self.transfers[e])
            self.wait_time += now() - waited
            return value
        self.ledger.release(self.local_keys.pop(e, None))
        return self.local.pop(e)

    def _give(self, e: int, value: Any, sends: list) -> None:
        if e in self.transfers:
            sends.append((self.transfers[e], value))
            return
        if isinstance(value, Tensor):
            self.local_keys[e] = self.ledger.hold(value)
        self.local[e] = value

    def _run(self, t: int, losses: dict[int, Tensor]) -> tuple[int, Any, Any]:
        """Run task `t`: gather its inputs, run the op, pass its outputs on."""
        g = self.graph
        task: Task = g.tasks[t]
        sm = self.modules[g.schedule.stages[task.stage].model_stage]
        x = state = grad = None
        for e in g.task_inputs[t]:
            src = g.tasks[g.edges[e].src]
            value = self._take(e)
            if task.op == F:
                x = value
            elif src.op in (F, R) or task.op == W:
                state = value
            else:
                grad = value
        entered = now()
        mark_start = self.timer.mark()
        out = None
        if task.op == F:
            if x is None:
                x = self.inputs[task.mb]
            target = self.targets[task.mb] if sm.is_last else None
            if (task.mb, task.stage) in self.recomputed:
                state, out = sm.forward_for_recompute(task.mb, x, target)
            else:
                state, out = sm.forward(task.mb, x, target)
        elif task.op == R:
            state = sm.recompute(state, self.targets[task.mb] if sm.is_last else None)
        elif task.op == BW:
            out = sm.backward_full(state, grad)
        elif task.op == B:
            out, state = sm.backward_input(state, grad)
        else:
            sm.backward_weight(state)
        mark_end = self.timer.mark()
        self.op_time += now() - entered
        # bookkeeping outside the op's span, so a span is the op alone (as calibration times it)
        if task.op == F:
            if (task.mb, task.stage) not in self.recomputed:
                self.forward_bytes.setdefault(sm.model_stage, []).append(held_bytes(state.boxes, []))
            if state.loss is not None:
                losses[task.mb] = state.loss
        elif task.op == R:  # what F saves without recomputation
            self.forward_bytes.setdefault(sm.model_stage, []).append(held_bytes(state.boxes, []))
        elif task.op == B:
            self.kept_bytes.setdefault(sm.model_stage, []).append(held_bytes(state.boxes, state.groups))
        sends: list = []
        for e in g.task_outputs[t]:
            dst = g.tasks[g.edges[e].dst]
            value = state if dst.stage == task.stage else out
            self._give(e, value, sends)
        if sends:
            self.transport.send_all(sends)
        return t, mark_start, mark_end
