"""torch.distributed.pipelining's action format, read and written without torch.

torch names an action "<stage><type><microbatch>", e.g. 2F0, 1I3, 0W5, 3B1; its stage is
our model stage, its I is our B (input gradient), its B is our BW (full backward), and
"(a;b)OVERLAP_F_B" is our overlapped pair. A CSV dump has one row per rank; empty cells
are idle slots. Communication and sharding actions (SEND_F, RECV_B, UNSHARD, ...) are
implied by our graph and skipped on import.

Export writes the compute-only form that torch's `_PipelineScheduleRuntime._load_csv`
lowers itself (it adds SEND/RECV, UNSHARD/RESHARD and REDUCE_GRAD); the stage-to-rank
mapping is inferred from the rows, so any placement (looped, V, hand-written) loads.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from .outputs import write_text
from .ir import B, BW, F, R, W, Overlap, Schedule, ScheduleError, Task, VirtualStage, unit_tasks

TO_OURS = {"F": F, "I": B, "W": W, "B": BW}
TO_TORCH = {ours: theirs for theirs, ours in TO_OURS.items()}
IMPLIED = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}
_ACTION = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")
MAX_INDEX_DIGITS = 9
"""Stage and microbatch numbers have at most this many digits (below 10**9); every
stage 0..S-1 and microbatch 0..M-1 must also appear in the file, so S and M are at most
the number of actions it holds."""
_LONG_NUMBER = re.compile(r"\d{%d,}" % (MAX_INDEX_DIGITS + 1))
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")

Action = tuple[str, int, int]  # (our op, torch stage, microbatch)


def parse_action(text: str) -> tuple[Action, ...] | None:
    """One torch action string as our (op, stage, mb) tuples; None for idle/implied ones."""
    text = text.strip()
    if not text or text == "None":
        return None
    overlap = _OVERLAP.match(text)
    if overlap:
        parts = [parse_action(s) for s in overlap.group(1).split(";") if s.strip()]
        if len(parts) != 2 or any(p is None or len(p) != 1 for p in parts):
            raise ScheduleError(f"OVERLAP_F_B must hold exactly two compute actions, got {text!r}")
        return parts[0] + parts[1]  # type: ignore[operator]
    if _LONG_NUMBER.search(text):
        raise ScheduleError(f"torch action {text[:40]!r}{'...' if len(text) > 40 else ''} has a number of more than "
                            f"{MAX_INDEX_DIGITS} digits; stage and microbatch indices are below 10**{MAX_INDEX_DIGITS}")
    match = _ACTION.match(text)
    if not match:
        raise ScheduleError(f"not a torch pipelining action: {text!r} (expected e.g. 2F0, 1I3, 0W5, 3B1)")
    stage, kind, mb = match.groups()
    if kind in IMPLIED:
        return None
    if not mb:
        raise ScheduleError(f"torch action {text!r} has no microbatch index")
    return ((TO_OURS[kind], int(stage), int(mb)),)


def from_rows(rows: list[list[str]], name: str = "torch") -> Schedule:
    """A Schedule from per-rank torch action strings (one list per rank)."""
    ranks = len(rows)
    if ranks == 0:
        raise ScheduleError("torch schedule has no ranks")
    placed: dict[int, int] = {}
    programs: list[list] = []
    mbs = set()
    for rank, row in enumerate(rows):
        program = []
        for cell in row:
            actions = parse_action(cell)
            if actions is None:
                continue
            tasks = []
            for op, stage, mb in actions:
                if placed.setdefault(stage, rank) != rank:
                    raise ScheduleError(f"torch stage {stage} appears on ranks {placed[stage]} and {rank}")
                tasks.append(Task(op, mb, stage))
                mbs.add(mb)
            program.append(Overlap(*tasks) if len(tasks) == 2 else tasks[0])
        programs.append(program)
    if not placed:
        raise ScheduleError("torch schedule never runs stage 0")
    # stages and microbatches are numbered densely from 0, so the largest index is below
    # the count of distinct ones; checked before any list of that size is made
    if max(placed) >= len(placed):
        missing = next(s for s in range(len(placed) + 1) if s not in placed)
        raise ScheduleError(f"torch schedule runs stage {max(placed)} but never stage {missing}; "
                            "stages must be numbered 0..S-1")
    if max(mbs) >= len(mbs):
        missing = next(m for m in range(len(mbs) + 1) if m not in mbs)
        raise ScheduleError(f"torch schedule runs microbatch {max(mbs)} but never microbatch {missing}; "
                            "microbatches must be numbered 0..M-1")
    num_stages = len(placed)
    microbatches = len(mbs)
    stages = [VirtualStage(placed[s], s) for s in range(num_stages)]
    return Schedule(name, ranks, microbatches, stages, [list(range(num_stages))],
                    [0] * microbatches, programs)


def read_csv(path: str | Path, name: str | None = None) -> Schedule:
    """A torch CSV dump (compute-only or with communication actions) as a Schedule."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScheduleError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"{str(path)!r} is not UTF-8 text (a CSV file)") from None
    try:
        rows = [row for row in csv.reader(io.StringIO(text))]
    except csv.Error as exc:  # e.g. a cell longer than the csv module's field limit
        raise ScheduleError(f"{str(path)!r} is not a torch CSV dump: {exc}") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    return from_rows(rows, name or Path(path).stem)


def action_string(task: Task) -> str:
    """A task (its stage already a model stage) as a torch action, e.g. 1I3."""
    return f"{task.stage}{TO_TORCH[task.op]}{task.mb}"


def to_rows(schedule: Schedule, overlap: bool = True) -> list[list[str]]:
    """Per-rank torch action strings (compute only), for torch's `_PipelineScheduleRuntime`.

    `overlap=False` writes an overlapped pair as its two actions one after the other:
    torch before 2.9 has no OVERLAP_F_B, and torch's runtime runs a pair's actions one
    after the other anyway. Refuses (ScheduleError) what torch's runtime cannot run:
    a model stage on more than one rank (DualPipe's replicas), a rank without ops,
    forwards of the last model stage out of microbatch order, and recompute ops (R):
    torch's action format has none (torch recomputes inside a stage module, with
    torch.utils.checkpoint, which its schedule does not see)."""
    model = [st.model_stage for st in schedule.stages]
    if sorted(model) != list(range(len(model))):
        raise ScheduleError(f"{schedule.name} places a model stage on more than one rank; "
                            "torch.distributed.pipelining has one copy of each stage")
    idle = next((r for r, program in enumerate(schedule.programs) if not program), None)
    if idle is not None:
        raise ScheduleError(f"{schedule.name}: rank {idle} runs nothing; torch's runtime needs "
                            "at least one stage on every rank")
    _check_loss_order(schedule, model)
    recompute = next((t for t in schedule.tasks() if t.op == R), None)
    if recompute is not None:
        raise ScheduleError(f"{schedule.name} recomputes ({recompute}); torch's action format has no recompute "
                            "op: export it without --recompute and wrap the stage modules in "
                            "torch.utils.checkpoint instead")
    rows = []
    for program in schedule.programs:
        row = []
        for item in program:
            tasks = [Task(t.op, t.mb, model[t.stage]) for t in unit_tasks(item)]
            if len(tasks) == 2 and overlap:
                row.append(f"({';'.join(action_string(t) for t in tasks)})OVERLAP_F_B")
            else:
                row.extend(action_string(t) for t in tasks)
        rows.append(row)
    return rows


def _check_loss_order(schedule: Schedule, model: list[int]) -> None:
    """torch's runtime appends each loss in the order the last stage's forwards run and
    hands the backward of microbatch i the i-th one (`_maybe_get_loss`, torch 2.13), so
    out of order it backpropagates the wrong loss (or fails)."""
    last = len(model) - 1
    seen = [t.mb for t in schedule.tasks() if t.op == F and model[t.stage] == last]
    for before, after in zip(seen, seen[1:]):
        if after < before:
            rank = schedule.stages[model.index(last)].rank
            raise ScheduleError(f"{schedule.name}: rank {rank} runs the last model stage's forwards out of "
                                f"microbatch order (F{before} before F{after}); torch's runtime matches "
                                "losses to microbatches by that order and would use the wrong loss")


def write_csv(schedule: Schedule, path: str | Path, overlap: bool = True) -> None:
    """`to_rows(schedule, overlap)` as a CSV file, one row per rank."""
    write_text(path, rows_csv(to_rows(schedule, overlap)), newline="")


def rows_csv(rows: list[list[str]]) -> str:
    """Per-rank action rows as CSV text."""
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()
