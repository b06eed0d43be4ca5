"""torch.distributed.pipelining's built-in schedules as our task graphs.

Uses torch's private `_schedule_visualizer.get_schedule_ops` (torch >= 2.6). Private
APIs go through `private_api`, so a torch build that lacks one gives a one-line error
naming the torch version and what is missing instead of failing obscurely.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import logging

from typing import TYPE_CHECKING, Any

from pipesched.schedules.ir import Schedule, ScheduleError
from pipesched.schedules.torch_format import from_rows

if TYPE_CHECKING:
    from pipesched.simulator.costs import CostModel

# torch's class names; lookups are case-insensitive like torch's own get_schedule_class
TORCH_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                   "ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE = {"gpipe", "1f1b"}
PIPELINING = "torch.distributed.pipelining"
TESTED = "pipesched supports torch >= 2.6 and is tested with 2.13"


def torch_version() -> str | None:
    """The installed torch's version, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (torch's errors often append a whole schedule)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def private_api(module: str, name: str, needed_for: str) -> Any:
    """`torch.distributed.pipelining.<module>.<name>` (a dotted name reaches into classes),
    or ScheduleError saying which torch lacks what; `needed_for` starts the message."""
    version = torch_version()
    if version is None:
        raise ScheduleError(f"{needed_for} needs torch (pip install 'pipesched[torch]')")
    where = f"{PIPELINING}.{module}"
    try:
        obj: Any = importlib.import_module(where)
    except ImportError as exc:
        raise ScheduleError(f"{needed_for} needs {where}, which torch {version} lacks "
                            f"({one_line(exc)}); {TESTED}") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ScheduleError(f"{needed_for} needs {where}.{name}, a private API that torch {version} "
                                f"lacks; {TESTED}")
    return obj


def torch_schedule(name: str, ranks: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """torch's schedule `name` for p ranks, m microbatches and v stages per rank."""
    canonical = {n.lower(): n for n in TORCH_SCHEDULES}.get(name.lower())
    if canonical is None:
        raise ScheduleError(f"unknown torch schedule {name!r}; torch has {', '.join(TORCH_SCHEDULES)}")
    get_schedule_ops = private_api("_schedule_visualizer", "get_schedule_ops", f"torch:{canonical}")
    if canonical.lower() in SINGLE_STAGE:
        if chunks not in (None, 1):
            raise ScheduleError(f"torch:{canonical} has one stage per rank, got -v {chunks}")
        chunks = 1
    elif canonical in ("ZBVZeroBubble", "DualPipeV"):
        if chunks not in (None, 2):
            raise ScheduleError(f"torch:{canonical} has exactly two stages per rank, got -v {chunks}")
        chunks = 2
    else:
        chunks = 2 if chunks is None else chunks
    try:  # an older or newer get_schedule_ops may take other arguments
        inspect.signature(get_schedule_ops).bind(canonical, ranks, microbatches, num_stages_per_rank=chunks)
    except TypeError as exc:
        raise ScheduleError(f"torch:{canonical}: torch {torch_version()}'s get_schedule_ops does not take "
                            f"the arguments of 2.13 ({one_line(exc)}); {TESTED}") from None
    quiet = logging.getLogger("torch.distributed.pipelining")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ops = get_schedule_ops(canonical, ranks, microbatches, num_stages_per_rank=chunks)
    except Exception as exc:  # torch raises ValueError, AssertionError, RuntimeError
        raise ScheduleError(f"torch:{canonical} refuses p={ranks} m={microbatches} v={chunks}: "
                            f"{one_line(exc)}") from None
    finally:
        quiet.setLevel(level)
    rows = [[str(a) if a is not None else "" for a in row] for row in ops]
    schedule = from_rows(rows, f"torch:{canonical}")
    schedule.params = {"v": chunks}
    if schedule.microbatches != microbatches:
        # e.g. torch 2.13's Schedule1F1B._get_pipeline_order runs F1..Fm on its last rank
        raise ScheduleError(f"torch:{canonical}'s action list for p={ranks} m={microbatches} is malformed "
                            f"(it names microbatches up to {schedule.microbatches - 1})")
    return schedule


# schedules both projects have: (ours, torch's class, chunks per rank)
SAME_NAME = (("gpipe", "GPipe", None), ("1f1b", "1F1B", None), ("interleaved-1f1b", "Interleaved1F1B", 2),
             ("looped-bfs", "LoopedBFS", 2), ("zb-v", "ZBVZeroBubble", None), ("dualpipev", "DualPipeV", None))


def compare_with_torch(ranks: int, microbatches: int, costs: "CostModel") -> list[dict]:
    """For every schedule both projects have: our makespan and fullest-rank peak memory
    against torch's order of the same name, both in our simulator under `costs` (ours
    built for those costs). Rows where torch cannot produce the schedule say why."""
    from pipesched.schedules.registry import build
    from pipesched.schedules.validate import validate
    from pipesched.simulator.api import simulate
    from pipesched.simulator.metrics import compute_metrics

    def measure(schedule: Schedule) -> tuple[float, float]:
        m = compute_metrics(simulate(validate(schedule), costs, engine="exact"))
        return m.makespan, max(r.peak_memory_bytes for r in m.per_rank)

    rows = []
    for ours, theirs, v in SAME_NAME:
        row = {"schedule": ours, "torch": theirs, "p": ranks, "m": microbatches, "v": v}
        try:
            reference = torch_schedule(theirs, ranks, microbatches, v)
        except ScheduleError as exc:
            rows.append({**row, "refused": str(exc)})
            continue
        mine = build(ours, ranks, microbatches, v, op_time=costs.op_time_for(ranks))
        (ms, mem), (ts, tmem) = measure(mine), measure(reference)
        rows.append({**row, "makespan": ms, "torch_makespan": ts, "peak_memory": mem, "torch_peak_memory": tmem})
    return rows
