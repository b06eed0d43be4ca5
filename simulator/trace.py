"""The Trace: what happened (or is predicted to happen) on each rank, over time.

Simulated and measured runs produce the same type, so every metric, figure and
comparison works on either. Times are seconds from the start of the step; memory is
bytes per rank sampled at every change.

Spans are stored column-wise (numpy arrays) because a large simulation has millions.
A compute span is one op; an overlapped pair gives two compute spans with `overlapped`
set. A transfer gives a `send` span on the sender and a `recv` span on the receiver,
both keyed by the producing op (op, mb, stage) and naming the other rank in `peer`.

A data-parallel step (simulator.data_parallel) adds its tail: `allreduce` spans, one
per gradient bucket, keyed by the stage's last weight-gradient op (W or BW), the bucket
number as mb and the stage, with peer -1 (the DP group is the rank's replicas); and one
optimizer step per stage on the compute lane, op OPT, mb 0. Traces written before the
allreduce lane existed load unchanged.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from pipesched.schedules.ir import OPS
from pipesched.schedules.numbers import is_int, is_real
from pipesched.schedules.outputs import write_text

FORMAT = "pipesched.trace/1"
COMPUTE, SEND, RECV, ALLREDUCE = 0, 1, 2, 3
LANES = ("compute", "send", "recv", "allreduce")
OPTIMIZER = "OPT"
SPAN_OPS = OPS + (OPTIMIZER,)  # a span's op indexes this: the schedule's ops, then the optimizer step
COLUMNS = ("rank", "lane", "op", "mb", "stage", "start", "end", "peer", "overlapped")


class TraceError(ValueError):
    """A trace file is unusable; the message says why."""


class Span(NamedTuple):
    rank: int
    lane: int      # COMPUTE, SEND, RECV or ALLREDUCE
    op: str        # F, B, W, BW, R or OPT (for transfers and all-reduces: the op that produced the payload)
    mb: int
    stage: int     # virtual stage index
    start: float   # seconds
    end: float     # seconds
    peer: int = -1  # the other rank of a transfer, -1 for compute
    overlapped: bool = False


@dataclass
class Trace:
    """What happened (or is predicted to happen) on each rank of one step: simulated
    (`simulate`) and measured (`run`) runs give the same type (module doc).

    schedule, ranks, microbatches: what ran; source: "simulated" or "measured".
    Spans, one per array entry (column-wise): rank; lane (COMPUTE, SEND, RECV or
    ALLREDUCE); op (index into SPAN_OPS: F, B, W, BW, R, then OPT); mb (microbatch);
    stage (virtual stage); start and end (seconds from the step's start); peer (the
    other rank of a transfer, -1 otherwise); overlapped (one of an overlapped pair).
    memory: per rank, (times in seconds, bytes held from then on).
    meta: anything else about the run (costs used, step times, ...).
    `save` / `load` write and read `pipesched.trace/1` JSON files.
    """

    schedule: str
    ranks: int
    microbatches: int
    source: str                                   # "simulated" or "measured"
    rank: np.ndarray
    lane: np.ndarray
    op: np.ndarray                                # index into SPAN_OPS (schedules.ir.OPS, then OPT)
    mb: np.ndarray
    stage: np.ndarray
    start: np.ndarray
    end: np.ndarray
    peer: np.ndarray
    overlapped: np.ndarray
    memory: list[tuple[np.ndarray, np.ndarray]]   # per rank: (times s, bytes)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spans(cls, schedule: str, ranks: int, microbatches: int, source: str,
                   spans: list[Span] | list[tuple], memory: list | None = None,
                   meta: dict | None = None) -> "Trace":
        cols = list(zip(*spans)) if spans else [[] for _ in COLUMNS]
        op_index = {name: i for i, name in enumerate(SPAN_OPS)}
        return cls(
            schedule, ranks, microbatches, source,
            rank=np.asarray(cols[0], dtype=np.int32), lane=np.asarray(cols[1], dtype=np.int8),
            op=np.asarray([op_index[o] for o in cols[2]], dtype=np.int8),
            mb=np.asarray(cols[3], dtype=np.int32), stage=np.asarray(cols[4], dtype=np.int32),
            start=np.asarray(cols[5], dtype=np.float64), end=np.asarray(cols[6], dtype=np.float64),
            peer=np.asarray(cols[7] if len(cols) > 7 else [-1] * len(spans), dtype=np.int32),
            overlapped=np.asarray(cols[8] if len(cols) > 8 else [False] * len(spans), dtype=bool),
            memory=[(np.asarray(t, dtype=np.float64), np.asarray(b, dtype=np.float64))
                    for t, b in (memory or [([], [])] * ranks)],
            meta=dict(meta or {}))

    def __len__(self) -> int:
        return len(self.start)

    def spans(self, lane: int | None = None, rank: int | None = None) -> Iterator[Span]:
        mask = self.mask(lane, rank)
        for i in np.flatnonzero(mask):
            yield Span(int(self.rank[i]), int(self.lane[i]), SPAN_OPS[self.op[i]], int(self.mb[i]),
                       int(self.stage[i]), float(self.start[i]), float(self.end[i]),
                       int(self.peer[i]), bool(self.overlapped[i]))

    def mask(self, lane: int | None = None, rank: int | None = None) -> np.ndarray:
        m = np.ones(len(self), dtype=bool)
        if lane is not None:
            m &= self.lane == lane
        if rank is not None:
            m &= self.rank == rank
        return m

    def shifted(self, offset: float) -> "Trace":
        """The same trace with every time moved by `offset` seconds."""
        return Trace(self.schedule, self.ranks, self.microbatches, self.source, self.rank,
                     self.lane, self.op, self.mb, self.stage, self.start + offset,
                     self.end + offset, self.peer, self.overlapped,
                     [(t + offset, b) for t, b in self.memory], dict(self.meta))

    def within(self, lo: float, hi: float) -> "Trace":
        """The spans that overlap [lo, hi] seconds (whole, not cut) and the memory samples
        inside it, led by each rank's level at lo."""
        keep = (self.end >= lo) & (self.start <= hi)
        memory = []
        for t, b in self.memory:
            inside = (t > lo) & (t <= hi)
            before = np.flatnonzero(t <= lo)
            lead = before[-1:] if len(before) else np.zeros(0, int)
            memory.append((np.concatenate((np.full(len(lead), lo), t[inside])),
                           np.concatenate((b[lead], b[inside]))))
        return self._subset(keep, memory)

    def first_ranks(self, ranks: int, microbatches: int) -> "Trace":
        """The spans and memory of ranks 0..ranks-1 alone, as a trace of `ranks` ranks and
        `microbatches` microbatches (e.g. replica 0 out of every data-parallel replica)."""
        out = self._subset(self.rank < ranks, self.memory[:ranks])
        out.ranks, out.microbatches = ranks, microbatches
        return out

    def _subset(self, keep: np.ndarray, memory: list) -> "Trace":
        return Trace(self.schedule, self.ranks, self.microbatches, self.source, self.rank[keep],
                     self.lane[keep], self.op[keep], self.mb[keep], self.stage[keep], self.start[keep],
                     self.end[keep], self.peer[keep], self.overlapped[keep], memory, dict(self.meta))

    def transfer_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Indices (sends, recvs) of the spans of each transfer: a send and its receive share
        the producing op's key and the (sender, receiver) pair; repeats pair up in time order."""
        by_key: dict[tuple, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for lane, side in ((SEND, 0), (RECV, 1)):
            for i in np.flatnonzero(self.lane == lane):
                r, peer = int(self.rank[i]), int(self.peer[i])
                link = (r, peer) if lane == SEND else (peer, r)
                by_key[(int(self.op[i]), int(self.mb[i]), int(self.stage[i]), *link)][side].append(int(i))
        pairs = [(s, r) for out, inc in by_key.values()
                 for s, r in zip(sorted(out, key=lambda i: self.start[i]), sorted(inc, key=lambda i: self.start[i]))]
        return np.array([s for s, _ in pairs], dtype=int), np.array([r for _, r in pairs], dtype=int)

    # --- JSON -------------------------------------------------------------------------

    def to_dict(self) -> dict:
        rows = [[int(r), LANES[l], SPAN_OPS[o], int(m), int(s), float(a), float(b), int(p), bool(v)]
                for r, l, o, m, s, a, b, p, v in zip(self.rank, self.lane, self.op, self.mb,
                                                      self.stage, self.start, self.end,
                                                      self.peer, self.overlapped)]
        return {"format": FORMAT, "schedule": self.schedule, "ranks": self.ranks,
                "microbatches": self.microbatches, "source": self.source,
                "columns": list(COLUMNS), "spans": rows,
                "memory": [[[float(x), float(y)] for x, y in zip(t, b)] for t, b in self.memory],
                "meta": self.meta}

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        """A Trace from its JSON document; TraceError naming the first thing wrong."""
        if not isinstance(data, dict):
            raise TraceError(f"a trace must be a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise TraceError(f"trace format is {data.get('format')!r}, expected {FORMAT!r}")
        missing = [k for k in ("schedule", "ranks", "microbatches", "columns", "spans", "memory") if k not in data]
        if missing:
            raise TraceError(f"trace lacks {missing[0]!r}")
        if data["columns"] != list(COLUMNS):
            raise TraceError(f"trace columns are {data['columns']!r}, expected {list(COLUMNS)}")
        ranks, microbatches = _count(data["ranks"], "ranks"), _count(data["microbatches"], "microbatches")
        for key in ("schedule", "source"):
            if not isinstance(data.get(key, ""), str):
                raise TraceError(f"trace {key} must be a string, got {data[key]!r}")
        if not isinstance(data.get("meta", {}), dict):
            raise TraceError(f"trace meta must be an object, got {type(data['meta']).__name__}")
        rows = _list(data["spans"], "spans")
        spans = [_span(row, i, ranks, microbatches, len(rows)) for i, row in enumerate(rows)]
        memory = _list(data["memory"], "memory")
        if len(memory) != ranks:
            raise TraceError(f"trace has memory for {len(memory)} ranks, expected {ranks}")
        samples = [[_sample(x, f"memory[{r}][{i}]") for i, x in enumerate(_list(per_rank, f"memory[{r}]"))]
                   for r, per_rank in enumerate(memory)]
        return cls.from_spans(data["schedule"], ranks, microbatches, data.get("source", "unknown"), spans,
                              [([t for t, _ in rows], [b for _, b in rows]) for rows in samples],
                              data.get("meta", {}))

    def save(self, path: str | Path) -> None:
        """Write the trace (JSON) atomically: a failed write leaves the previous file."""
        write_text(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
        except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
            raise TraceError(f"trace {str(path)!r} is not valid JSON: {exc}") from None
        except RecursionError:
            raise TraceError(f"trace {str(path)!r} is not a trace: its JSON nests too deeply") from None
        return cls.from_dict(data)


# --- checking a trace document --------------------------------------------------------

_INT32 = 2 ** 31 - 1  # mb and stage are stored as int32


def _is_int(x: Any) -> bool:
    return is_int(x)


def _count(x: Any, where: str) -> int:
    if not _is_int(x) or not 1 <= x <= _INT32:
        raise TraceError(f"trace {where} must be an integer >= 1, got {x!r}")
    return x


def _list(x: Any, where: str) -> list:
    if not isinstance(x, list):
        raise TraceError(f"trace {where} must be a list, got {type(x).__name__}")
    return x


def _time(x: Any) -> bool:
    return is_real(x) and math.isfinite(x)


def _span(row: Any, i: int, ranks: int, microbatches: int, spans: int) -> Span:
    """One row of `spans`, checked: every field of the right type and in range. Virtual
    stages are numbered 0..V-1 and each runs ops, so a stage index is below the number
    of spans."""
    where = f"trace span {i}"
    if not isinstance(row, list) or len(row) != len(COLUMNS):
        raise TraceError(f"{where} must be a list of the {len(COLUMNS)} columns, got {str(row)[:80]}")
    rank, lane, op, mb, stage, start, end, peer, overlapped = row
    if not _is_int(rank) or not 0 <= rank < ranks:
        raise TraceError(f"{where} has rank {rank!r}, outside 0..{ranks - 1}")
    if lane not in LANES:
        raise TraceError(f"{where} has lane {lane!r}; lanes are {', '.join(LANES)}")
    if op not in SPAN_OPS:
        raise TraceError(f"{where} has op {op!r}; ops are {', '.join(SPAN_OPS)}")
    if op == OPTIMIZER and lane != "compute":
        raise TraceError(f"{where} is an optimizer step (OPT) on lane {lane!r}; it runs on the compute lane")
    if lane == "allreduce":  # mb is the bucket's number
        if not _is_int(mb) or not 0 <= mb <= _INT32:
            raise TraceError(f"{where} has bucket {mb!r}, need an integer >= 0")
    elif not _is_int(mb) or not 0 <= mb < microbatches:
        raise TraceError(f"{where} has microbatch {mb!r}, outside 0..{microbatches - 1}")
    if not _is_int(stage) or not 0 <= stage < min(spans, _INT32):
        raise TraceError(f"{where} has stage {stage!r}, need an integer in 0..{min(spans, _INT32) - 1} "
                         "(virtual stages are numbered from 0, each with ops)")
    if not (_time(start) and _time(end) and start <= end):
        raise TraceError(f"{where} runs from {start!r} to {end!r}; times must be finite seconds, end >= start")
    transfer = lane in ("send", "recv")
    if not _is_int(peer) or (peer not in range(ranks) or peer == rank if transfer else peer != -1):
        need = f"another rank in 0..{ranks - 1}" if transfer else f"-1 for {lane}"
        raise TraceError(f"{where} has peer {peer!r}, need {need}")
    if not isinstance(overlapped, bool):
        raise TraceError(f"{where} has overlapped {overlapped!r}, need true or false")
    return Span(rank, LANES.index(lane), op, mb, stage, float(start), float(end), peer, overlapped)


def _sample(x: Any, where: str) -> tuple[float, float]:
    if not (isinstance(x, list) and len(x) == 2 and _time(x[0]) and _time(x[1])):
        raise TraceError(f"trace {where} must be [seconds, bytes] with finite numbers, got {str(x)[:80]}")
    if x[1] < 0:
        raise TraceError(f"trace {where} holds {x[1]!r} bytes; memory is never negative")
    return float(x[0]), float(x[1])
