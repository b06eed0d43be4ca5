"""The schedule file format `pipesched.schedule/1` (JSON).

    {"format": "pipesched.schedule/1", "name": "...", "ranks": P, "microbatches": M,
     "stages": [{"rank": r, "model_stage": k}, ...],   # virtual stages; index = position
     "paths": [[s0, s1, ...], ...],                     # virtual-stage sequences
     "microbatch_paths": [path index per microbatch],   # optional, default all 0
     "programs": [[op or [op, op], ...], ...]}          # one list per rank, in order
    op = {"op": "F"|"B"|"W"|"BW"|"R", "mb": i, "stage": s}  # s = virtual stage index; R: recompute

A two-element list is an overlapped pair. Loading checks the shape of the document;
`schedules.validate` checks the schedule itself.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .outputs import write_text
from .ir import Overlap, ProgramItem, Schedule, ScheduleError, Task, VirtualStage
from .numbers import is_int

FORMAT = "pipesched.schedule/1"


def _task_dict(t: Task) -> dict:
    return {"op": t.op, "mb": t.mb, "stage": t.stage}


def to_dict(schedule: Schedule) -> dict:
    return {
        "format": FORMAT, "name": schedule.name, "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "stages": [{"rank": s.rank, "model_stage": s.model_stage} for s in schedule.stages],
        "paths": [list(p) for p in schedule.paths],
        "microbatch_paths": list(schedule.microbatch_paths),
        "programs": [[[_task_dict(t) for t in item] if isinstance(item, Overlap) else _task_dict(item)
                      for item in program] for program in schedule.programs],
    }


def _int(value: Any, where: str) -> int:
    if not is_int(value):
        raise ScheduleError(f"{where} must be an integer, got {value!r}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ScheduleError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _task(value: Any, where: str) -> Task:
    if not isinstance(value, dict) or set(value) != {"op", "mb", "stage"}:
        raise ScheduleError(f"{where} must be an object with exactly op, mb and stage, got {value!r}")
    if not isinstance(value["op"], str):
        raise ScheduleError(f"{where}.op must be a string, got {value['op']!r}")
    return Task(value["op"], _int(value["mb"], f"{where}.mb"), _int(value["stage"], f"{where}.stage"))


def _item(value: Any, where: str) -> ProgramItem:
    if isinstance(value, list):
        if len(value) != 2:
            raise ScheduleError(f"{where} is an overlapped group of {len(value)} ops; a group has exactly 2")
        return Overlap(_task(value[0], f"{where}[0]"), _task(value[1], f"{where}[1]"))
    return _task(value, where)


def from_dict(data: Any) -> Schedule:
    if not isinstance(data, dict):
        raise ScheduleError("schedule file must hold a JSON object")
    if data.get("format") != FORMAT:
        raise ScheduleError(f"schedule file format is {data.get('format')!r}, expected {FORMAT!r}")
    required = ("name", "ranks", "microbatches", "stages", "paths", "programs")
    missing = [k for k in required if k not in data]
    if missing:
        raise ScheduleError(f"schedule file lacks {missing[0]!r}")
    unknown = sorted(set(data) - set(required) - {"format", "microbatch_paths"})
    if unknown:
        raise ScheduleError(f"schedule file has unknown field {unknown[0]!r}")
    if not isinstance(data["name"], str):
        raise ScheduleError(f"name must be a string, got {data['name']!r}")
    ranks = _int(data["ranks"], "ranks")
    microbatches = _int(data["microbatches"], "microbatches")
    stages = []
    for i, st in enumerate(_list(data["stages"], "stages")):
        if not isinstance(st, dict) or set(st) != {"rank", "model_stage"}:
            raise ScheduleError(f"stages[{i}] must be an object with exactly rank and model_stage, got {st!r}")
        stages.append(VirtualStage(_int(st["rank"], f"stages[{i}].rank"), _int(st["model_stage"], f"stages[{i}].model_stage")))
    paths = [[_int(s, f"paths[{p}][{k}]") for k, s in enumerate(_list(path, f"paths[{p}]"))]
             for p, path in enumerate(_list(data["paths"], "paths"))]
    programs = [[_item(x, f"programs[{r}][{i}]") for i, x in enumerate(_list(prog, f"programs[{r}]"))]
                for r, prog in enumerate(_list(data["programs"], "programs"))]
    if "microbatch_paths" in data:
        mb_paths = [_int(x, f"microbatch_paths[{i}]") for i, x in enumerate(_list(data["microbatch_paths"], "microbatch_paths"))]
    else:
        ops = sum(len(item) if isinstance(item, Overlap) else 1 for prog in programs for item in prog)
        if microbatches > ops:  # checked before the default list is made: a huge count would exhaust memory
            raise ScheduleError(f"microbatches is {microbatches} but the programs hold only {ops} ops; "
                                f"every microbatch needs an F and a backward")
        mb_paths = [0] * max(microbatches, 0)
    return Schedule(data["name"], ranks, microbatches, stages, paths, mb_paths, programs)


def dumps(schedule: Schedule) -> str:
    """JSON with one stage, path and program element per line, so files stay readable
    and diffable."""
    doc = to_dict(schedule)
    lines = [f' "{key}": {json.dumps(doc[key])},' for key in ("format", "name", "ranks", "microbatches")]
    for key in ("stages", "paths"):
        lines.append(f' "{key}": [\n  ' + ",\n  ".join(json.dumps(x) for x in doc[key]) + "],")
    lines.append(f' "microbatch_paths": {json.dumps(doc["microbatch_paths"])},')
    body = ",\n".join("  [" + ",\n   ".join(json.dumps(x) for x in prog) + "]" for prog in doc["programs"])
    lines.append(f' "programs": [\n{body}\n ]')
    return "{\n" + "\n".join(lines) + "\n}\n"


def loads(text: str) -> Schedule:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ScheduleError(f"schedule file is not valid JSON: {exc}") from None
    except RecursionError:
        raise ScheduleError("schedule file is not a schedule: its JSON nests too deeply") from None
    return from_dict(data)


def load(path: str | Path) -> Schedule:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"cannot read schedule file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ScheduleError(f"schedule file {str(path)!r} is not UTF-8 text (JSON): {exc.reason} at byte {exc.start}") from None
    return loads(text)


def save(schedule: Schedule, path: str | Path) -> None:
    """Write the schedule file atomically (`outputs.write_text`)."""
    write_text(path, dumps(schedule))
