"""Our schedules on torch.distributed.pipelining's own runtime.

A schedule exported in torch's compute-only CSV (`schedules.torch_format.to_rows`) is
loaded by torch's `_PipelineScheduleRuntime._load_csv`, which infers the stage-to-rank
mapping from the rows and adds the sends, receives and gradient reductions itself; each
rank holds one `PipelineStage(module, k, S)` per model stage k it runs.
`run_on_torch_runtime` does exactly that inside `launch_local` ranks (gloo on CPU) for
any model the executor runs, and returns per schedule its step times, its loss and
every model stage's gradients, compared with `executor.reference`. Tied parameters
(used by stages on different ranks) get the executor's own gradient exchange
(`executor.replicas`) after torch's step, which sums nothing across ranks. `check_loads` runs only torch's loading and lowering, in this
process (no ranks), which is what `pipesched export-torch --check` does.

Private torch APIs used: `schedules._PipelineScheduleRuntime` and its `_load_csv`
(torch >= 2.6); OVERLAP_F_B pairs need torch >= 2.9 and are written as two consecutive
actions before that. A missing API is a one-line ScheduleError naming the torch version.
"""
from __future__ import annotations

import copy
import inspect
import pickle
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from unittest import mock

import torch
import torch.distributed as dist
from torch import Tensor

from pipesched.schedules import torch_format
from pipesched.schedules.ir import Schedule, ScheduleError
from pipesched.schedules.validate import validate

from . import replicas
from .clock import now
from .comm import ExecutorError
from .launch import RankContext, launch_local
from .models import ExampleModel, PipelineModel, check_model
from .reference import Check, compare
from .torch_schedules import one_line, private_api, torch_version

NEEDED_FOR = "running a schedule on torch's _PipelineScheduleRuntime"


def runtime_class() -> type:
    """torch's `_PipelineScheduleRuntime`, checked to have `_load_csv`; else ScheduleError."""
    cls = private_api("schedules", "_PipelineScheduleRuntime", NEEDED_FOR)
    private_api("schedules", "_PipelineScheduleRuntime._load_csv", NEEDED_FOR)
    return cls


def supports_overlap() -> bool:
    """Whether this torch reads "(a;b)OVERLAP_F_B" actions (torch >= 2.9)."""
    kinds = private_api("schedules", "_ComputationType", NEEDED_FOR)
    return hasattr(kinds, "OVERLAP_F_B")


@dataclass(frozen=True)
class TorchCase:
    """One compute-only CSV ready for torch's runtime; `stage_ranks[k]` holds model stage k."""

    name: str
    text: str
    ranks: int
    microbatches: int
    stage_ranks: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)


@dataclass(repr=False)
class TorchRuntimeResult:
    """One schedule on torch's runtime: `step_times` in seconds per measured step (first
    start to last end over ranks, as `executor.job` measures its own steps); `loss` =
    loss_scale * sum of the microbatch losses of the last step (added in microbatch
    order, like the reference); `grads[k]` = model stage k's parameter gradients after
    it, in `parameters()` order; `reference`: that step against the unpipelined model
    (None when not checked). Its repr is one line (no tensors)."""

    name: str
    microbatches: int
    num_stages: int
    loss: float
    grads: dict[int, list[Tensor | None]]
    step_times: list[float] = field(default_factory=list)
    reference: Check | None = None

    @property
    def step_time_median(self) -> float:
        return statistics.median(self.step_times) if self.step_times else float("nan")

    def check(self, model: PipelineModel | ExampleModel) -> Check:
        """This step against the unpipelined reference of the same model and microbatches."""
        built = model.build(self.num_stages, self.microbatches) if isinstance(model, ExampleModel) else model
        return compare(built, self.loss, self.grads)

    def summary(self) -> str:
        """One line: the schedule, the step time and the reference check."""
        line = (f"{self.name} on torch's runtime: {self.num_stages} model stages, {self.microbatches} microbatches, "
                f"step time median {self.step_time_median * 1e3:.3f} ms over {len(self.step_times)} steps, "
                f"loss {self.loss:.10g}")
        c = self.reference
        if c is not None:
            ok = c.loss_matches and c.grads_match
            line += (f"; reference check {'passed' if ok else 'FAILED'} (loss relative error {c.loss_rel_error:.2g}, "
                     f"max gradient relative error {c.max_grad_rel_error:.2g})")
        return line

    def __repr__(self) -> str:
        return f"<TorchRuntimeResult {self.summary()}>"


def case_from_rows(rows: list[list[str]], name: str) -> TorchCase:
    """A TorchCase from per-rank action strings (as `torch_format.to_rows` writes them)."""
    shape = torch_format.from_rows(rows, name)
    return _case(shape, "".join(",".join(row) + "\n" for row in rows))


def _case(shape: Schedule, text: str) -> TorchCase:
    return TorchCase(shape.name, text, shape.ranks, shape.microbatches,
                     tuple(st.rank for st in sorted(shape.stages, key=lambda st: st.model_stage)))


def prepare(source: Schedule | str | Path) -> TorchCase:
    """A schedule (exported here, pairs split where this torch has no OVERLAP_F_B) or a
    compute-only torch CSV file (given to torch as it is, e.g. from `pipesched
    export-torch`), checked by our validator and by torch's own loading before any
    process starts."""
    if isinstance(source, Schedule):
        validate(source)
        case = case_from_rows(torch_format.to_rows(source, supports_overlap()), source.name)
    else:
        shape = torch_format.read_csv(source)
        validate(shape)
        torch_format.to_rows(shape)  # for its refusals (e.g. the last stage's forwards out of order)
        case = _case(shape, Path(source).read_text())
    check_loads(case)
    return case


def _mock_stage(rank: int, case: TorchCase) -> Any:
    # what torch's own _schedule_visualizer does to build a schedule without processes
    from torch.distributed.pipelining import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size = rank, case.ranks
    held = [k for k, r in enumerate(case.stage_ranks) if r == rank]
    stage.num_stages, stage.stage_index, stage.submod = case.num_stages, held[0] if held else 0, None
    return stage


def check_loads(case: TorchCase) -> None:
    """Load `case` with torch's `_PipelineScheduleRuntime._load_csv` (validation, stage
    mapping, send/recv lowering) in this process; ScheduleError if torch refuses it."""
    cls = runtime_class()
    if "OVERLAP_F_B" in case.text and not supports_overlap():
        raise ScheduleError(f"{case.name} has OVERLAP_F_B actions, which torch {torch_version()} cannot read "
                            "(torch >= 2.9); export it with --no-overlap")
    with tempfile.TemporaryDirectory(prefix="pipesched-") as tmp:
        path = Path(tmp) / "schedule.csv"
        path.write_text(case.text)
        try:
            cls([_mock_stage(0, case)], n_microbatches=case.microbatches)._load_csv(str(path))
        except Exception as exc:  # torch raises AssertionError, ValueError, RuntimeError
            raise ScheduleError(f"torch {torch_version()}'s _PipelineScheduleRuntime refuses {case.name}: "
                                f"{one_line(exc)}") from None


def _runtime_kwargs(cls: type) -> dict:
    # torch >= 2.6 divides gradients by m unless scale_grads=False; our loss already
    # carries the model's loss_scale, as in the reference
    params: dict = {}
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            params.update(inspect.signature(klass.__init__).parameters)
    return {"scale_grads": False} if "scale_grads" in params else {}


SUM_TAG_BASE = 1 << 20  # tags of the tied-gradient exchange, above any torch uses


def _run_case(ctx: RankContext, case: TorchCase, spec: PipelineModel | ExampleModel, steps: int,
              warmup: int) -> Any:
    from torch.distributed.pipelining import PipelineStage

    cls = runtime_class()
    model = spec.build(case.num_stages, case.microbatches) if isinstance(spec, ExampleModel) else spec
    modules = [m.to(ctx.device) for m in copy.deepcopy(list(model.stages))]  # one copy per case, ties kept
    mine = [k for k, r in enumerate(case.stage_ranks) if r == ctx.rank]
    stages = [PipelineStage(modules[k], k, case.num_stages, ctx.device) for k in mine]
    # torch sums nothing across ranks: tied parameters get the executor's own exchange
    tied = replicas.shared_groups({k: [r] for k, r in enumerate(case.stage_ranks)}, modules)
    scale = model.scale

    def loss_fn(output: Tensor, target: Tensor) -> Tensor:
        return model.loss_fn(output, target) * scale

    runtime = cls(stages, n_microbatches=case.microbatches, loss_fn=loss_fn, **_runtime_kwargs(cls))
    with tempfile.TemporaryDirectory(prefix="pipesched-") as tmp:
        path = Path(tmp) / "schedule.csv"
        path.write_text(case.text)
        runtime._load_csv(str(path))  # the exported file itself, as a user would load it
    first, last = 0 in mine, case.num_stages - 1 in mine
    inputs = (torch.cat(model.inputs).to(ctx.device),) if first else ()
    target = torch.cat(model.targets).to(ctx.device) if last else None
    bounds = []
    for _ in range(warmup + steps):
        for m in modules:
            for p in m.parameters():
                p.grad = None
        losses: list | None = [] if last else None
        dist.barrier()
        start = now()
        runtime.step(*inputs, target=target, losses=losses)
        replicas.sum_shared_grads(ctx.rank, tied, modules, SUM_TAG_BASE, ctx.timeout, ctx.device)
        bounds.append((start, now()))
    grads = {k: [None if p.grad is None else p.grad.detach().cpu().clone()
                 for p in st.submod.parameters() if p.requires_grad] for k, st in zip(mine, stages)}
    mb_losses = [float(loss.detach()) for loss in losses] if losses is not None else None
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object((grads, mb_losses, bounds[warmup:]), gathered, dst=0)
    if gathered is None:
        return None
    all_grads: dict[int, list[Tensor | None]] = {}
    total = 0.0
    for rank_grads, rank_losses, _ in gathered:
        all_grads.update(rank_grads)
        for value in rank_losses or ():  # microbatch order: the export keeps the last stage's F in order
            total += value
    step_times = [max(b[i][1] for _, _, b in gathered) - min(b[i][0] for _, _, b in gathered) for i in range(steps)]
    return TorchRuntimeResult(case.name, case.microbatches, case.num_stages, total, all_grads, step_times)


def _rank_job(ctx: RankContext, cases: list[TorchCase], spec: PipelineModel | ExampleModel, steps: int,
              warmup: int) -> bytes | None:
    results = [_run_case(ctx, case, spec, steps, warmup) for case in cases]
    dist.barrier()  # no rank tears its connections down while a peer still talks to it
    # plain pickle: the launcher's pipe would share tensor storage with a process that exits
    return pickle.dumps(results) if ctx.rank == 0 else None


def run_on_torch_runtime(sources: Sequence[Schedule | str | Path], model: PipelineModel | ExampleModel,
                         timeout: float = 120.0, steps: int = 1, warmup: int = 0, check: bool = True,
                         verbose: bool = True) -> list[TorchRuntimeResult]:
    """Run each schedule (or torch CSV file) for `warmup + steps` steps on torch's
    runtime, all in one launch of `ranks` local processes (gloo, CPU; every source must
    have the same number of ranks); `timeout` in seconds bounds every wait. `model`: any
    model the executor runs (its stage count must match every source). Everything is
    checked first, so a schedule torch cannot run or a model that does not fit is refused
    (ScheduleError, ModelError) before any process starts. With `check`, each result's
    `reference` compares its last step with the unpipelined model; with `verbose`, one
    summary line per schedule is printed."""
    if isinstance(model, ExampleModel):
        model.check()
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    cases = [prepare(s) for s in sources]
    ranks = {c.ranks for c in cases}
    if len(ranks) != 1:
        raise ScheduleError(f"one launch runs one number of ranks, got {sorted(ranks)}")
    for case in cases:
        built = model.build(case.num_stages, case.microbatches) if isinstance(model, ExampleModel) else model
        check_model(built, case.num_stages, case.microbatches)
    try:
        data = launch_local(_rank_job, (cases, model, steps, warmup), ranks.pop(), "gloo", timeout)
    except ExecutorError as exc:
        raise ExecutorError(one_line(exc)) from None
    results = pickle.loads(data)
    for result in results:
        if check:
            result.reference = result.check(model)
        if verbose:
            print(result.summary())
    return results
