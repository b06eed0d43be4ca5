"""Any Trace as a Chrome trace-event JSON document, for ui.perfetto.dev and chrome://tracing.

One process per rank with a compute thread and a thread per link for sends and for
receives; every span is a complete ("X") event with its real duration; a flow ("s" ->
"f") links each send to its receive; memory is a counter track per rank. Trace-event
times are microseconds, so seconds are multiplied by 1e6. Only the JSON object format
of the trace-event spec is used, which both viewers read. No matplotlib, no torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipesched.schedules.outputs import write_text

from .trace import ALLREDUCE, COMPUTE, RECV, SEND, SPAN_OPS, Trace

US = 1e6  # trace-event timestamps are microseconds
TRANSFER_CAT = "transfer"  # slices and flow events share it: viewers bind a flow by (cat, pid, tid, ts)
ALLREDUCE_CAT = "allreduce"  # the data-parallel gradient all-reduces


def _us(seconds: float, offset: float) -> float:
    # rounded to nanoseconds so a flow event's ts equals its slice's ts exactly
    return round((seconds + offset) * US, 3)


def _slots(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A slot per interval such that intervals in one slot never overlap: viewers need
    the slices of a thread properly nested, and concurrent transfers or an overlapped
    pair would not be."""
    slot = np.zeros(len(starts), dtype=int)
    free_at: list[float] = []
    for i in np.lexsort((ends, starts)):
        k = next((k for k, t in enumerate(free_at) if t <= starts[i]), len(free_at))
        if k == len(free_at):
            free_at.append(0.0)
        free_at[k] = float(ends[i])
        slot[i] = k
    return slot


def _threads(trace: Trace) -> tuple[np.ndarray, dict[int, list[tuple[int, str]]]]:
    """tid of every span, and per rank the (tid, name) of its threads in display order."""
    tid = np.zeros(len(trace), dtype=int)
    names: dict[int, list[tuple[int, str]]] = {}
    # spans grouped by rank once, so the work is linear in spans plus ranks (a mask per
    # rank would scan every span once per rank)
    by_rank = np.argsort(trace.rank, kind="stable")
    bounds = np.searchsorted(trace.rank[by_rank], np.arange(trace.ranks + 1))
    for r in range(trace.ranks):
        mine = by_rank[bounds[r]:bounds[r + 1]]
        groups: list[tuple[str, np.ndarray]] = [("compute", mine[trace.lane[mine] == COMPUTE])]
        for lane, word, arrow in ((SEND, "send", "to"), (RECV, "recv", "from")):
            on = mine[trace.lane[mine] == lane]
            for peer in np.unique(trace.peer[on]):
                groups.append((f"{word} {arrow} rank {peer}", on[trace.peer[on] == peer]))
        dp = mine[trace.lane[mine] == ALLREDUCE]
        if len(dp):
            groups.append(("DP all-reduce", dp))
        names[r] = []
        for name, idx in groups:
            slot = _slots(trace.start[idx], trace.end[idx]) if len(idx) else np.zeros(0, dtype=int)
            base = len(names[r])
            for k in range(int(slot.max()) + 1 if len(slot) else 1):
                names[r].append((base + k, name if k == 0 else f"{name} ({k + 1})"))
            tid[idx] = base + slot
    return tid, names


def to_chrome_trace(trace: Trace) -> dict[str, Any]:
    """The trace-event document of `trace` (a dict ready for json.dump).

    Threads per rank: "compute" (and "compute (2)" for the second op of overlapped
    pairs), "send to rank q" and "recv from rank q" per peer (more where transfers on
    one link run concurrently). Times are shifted so that none is negative; the shift
    (seconds) is kept in otherData.offset_s.
    """
    times = [trace.start] + [t for t, _ in trace.memory if len(t)]
    earliest = min((float(np.min(t)) for t in times if len(t)), default=0.0)
    offset = -min(earliest, 0.0)
    events, _ = _events(trace, offset, pid_base=0, label="", first_flow=1)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": trace.schedule, "ranks": trace.ranks,
                          "microbatches": trace.microbatches, "source": trace.source,
                          "time_unit": "us", "offset_s": offset,
                          **{f"meta.{k}": v for k, v in trace.meta.items()
                             if isinstance(v, (str, int, float, bool))}}}


def to_chrome_traces(named: list[tuple[str, Trace]]) -> dict[str, Any]:
    """Several traces in one document, e.g. predicted and measured runs of a schedule:
    each starts at 0 at its first event (op or memory sample), and its ranks are processes named "NAME rank r",
    one trace's ranks after the other's."""
    events: list[dict[str, Any]] = []
    pid_base, flow = 0, 1
    for name, trace in named:
        comp = trace.lane == COMPUTE
        first = float(trace.start[comp].min()) if comp.any() else 0.0
        earliest = min([first] + [float(t.min()) for t, _ in trace.memory if len(t)])
        more, flow = _events(trace, -earliest, pid_base, f"{name} ", flow)
        events += more
        pid_base += trace.ranks
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"traces": [{"name": name, "schedule": t.schedule, "ranks": t.ranks,
                                      "microbatches": t.microbatches, "source": t.source} for name, t in named],
                          "time_unit": "us"}}


def _events(trace: Trace, offset: float, pid_base: int, label: str, first_flow: int
            ) -> tuple[list[dict[str, Any]], int]:
    """The events of `trace` with `offset` seconds added to every time, its rank r as
    process pid_base + r named "<label>rank r", and flow ids from `first_flow`; returns
    them and the next free flow id."""
    tids, threads = _threads(trace)
    events: list[dict[str, Any]] = []
    for r in range(trace.ranks):
        pid = pid_base + r
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{label}rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for tid, name in threads[r]:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})

    for i in range(len(trace)):
        r, lane, op = int(trace.rank[i]), int(trace.lane[i]), SPAN_OPS[trace.op[i]]
        mb, stage, peer = int(trace.mb[i]), int(trace.stage[i]), int(trace.peer[i])
        args: dict[str, Any] = {"op": op, "microbatch": mb, "stage": stage}
        if lane == COMPUTE:
            name, cat = f"{op}{mb}", op
            if trace.overlapped[i]:
                args["overlapped"] = True
        elif lane == ALLREDUCE:
            name, cat = f"all-reduce stage {stage} bucket {mb}", ALLREDUCE_CAT
            args = {"stage": stage, "bucket": mb, "after": op}
        else:
            name, cat = f"{op}{mb}@{stage} {'->' if lane == SEND else '<-'} rank {peer}", TRANSFER_CAT
            args["peer"] = peer
        events.append({"ph": "X", "name": name, "cat": cat, "pid": pid_base + r, "tid": int(tids[i]),
                       "ts": _us(float(trace.start[i]), offset),
                       "dur": round(float(trace.end[i] - trace.start[i]) * US, 3), "args": args})

    first = len(events) - len(trace)  # span i is events[first + i]
    flows = []
    flow_id = first_flow
    for s, f in zip(*trace.transfer_pairs()):
        for ev, ph in ((events[first + s], "s"), (events[first + f], "f")):
            flow = {"ph": ph, "name": "transfer", "cat": TRANSFER_CAT, "id": flow_id,
                    "pid": ev["pid"], "tid": ev["tid"], "ts": ev["ts"]}
            if ph == "f":
                flow["bp"] = "e"  # bind to the recv slice that starts at ts, not the next one
            flows.append(flow)
        flow_id += 1
    events.extend(flows)

    for r, (times_s, nbytes) in enumerate(trace.memory):
        for t, b in zip(times_s, nbytes):
            events.append({"ph": "C", "name": "memory", "pid": pid_base + r, "tid": 0, "ts": _us(float(t), offset),
                           "args": {"bytes": float(b)}})
    return events, flow_id


def save_chrome_trace(trace: Trace | list[tuple[str, Trace]], path: str | Path) -> None:
    """Write `trace` (or several named traces, see `to_chrome_traces`) as trace-event JSON
    (open it in ui.perfetto.dev or chrome://tracing)."""
    doc = to_chrome_traces(trace) if isinstance(trace, list) else to_chrome_trace(trace)
    write_text(path, json.dumps(doc, separators=(",", ":")) + "\n")
