"""Saved runs of the accuracy benchmarks, stored compactly.

A benchmark's `--save-runs FILE` document is JSON whose measured Traces hold one row per
span; a launch of nine schedules is megabytes that way. Here every Trace in the document is
stored as columns instead (`numpy.savez_compressed`: rank, lane, op and stage as small
integers, start and end as float64 seconds, memory samples as differences in whole
microseconds and bytes) and the rest of the
document as one JSON string, which makes a file about ten times smaller and loads as fast.

    write("runs.npz", doc)      # doc: any JSON document holding Trace dicts
    doc = read("runs.npz")      # the same document back; `.json.gz` files load too

Files older than this format (gzipped JSON) are read unchanged, so a run saved before can
be evaluated again.
"""
from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

TRACE_FORMAT = "pipesched.trace/1"
_KEY = "$rows"
_INTEGER_COLUMNS = ("rank", "lane", "op", "mb", "stage", "peer", "overlapped")
_NAMED_COLUMNS = ("lane", "op")


class _Store:
    """Every Trace's columns appended to one array per column, so they compress together."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {}
        self.names: dict[str, list[str]] = {name: [] for name in _NAMED_COLUMNS}

    def add(self, name: str, values: list) -> list[int]:
        """Append `values` to column `name`; returns [offset, count]."""
        if name in self.names:
            names = self.names[name]
            for v in values:
                if v not in names:
                    names.append(v)
            values = [names.index(v) for v in values]
        column = self.columns.setdefault(name, [])
        column.extend(values)
        return [len(column) - len(values), len(values)]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f"names_{k}": np.array(v) for k, v in self.names.items()}
        for name, values in self.columns.items():
            if name == "memory_time":  # whole microseconds, as differences: the peak needs no more
                out[name] = np.diff(np.round(np.asarray(values) * 1e6), prepend=0.0).astype(np.int64)
            else:
                out[name] = np.asarray(values, dtype=np.int64 if name in _INTEGER_COLUMNS
                                       or name == "memory_step" else np.float64)
        return out


def _pack(node: Any, store: _Store) -> Any:
    """`node` with every Trace's spans and memory moved into `store`."""
    if isinstance(node, list):
        return [_pack(x, store) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") != TRACE_FORMAT or "spans" not in node:
        return {k: _pack(v, store) for k, v in node.items()}
    packed = {k: v for k, v in node.items() if k not in ("spans", "memory")}
    packed[_KEY] = {name: store.add(name, [row[i] for row in node["spans"]])
                    for i, name in enumerate(node["columns"])}
    memory = []
    for samples in node["memory"]:
        samples = np.asarray(samples, dtype=np.float64).reshape(-1, 2)
        # bytes as whole-byte differences, which repeat and compress
        memory.append([store.add("memory_time", samples[:, 0].tolist()),
                       store.add("memory_step", np.diff(samples[:, 1], prepend=0.0).tolist())])
    packed["$memory"] = memory
    return packed


def _unpack(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, list):
        return [_unpack(x, arrays) for x in node]
    if not isinstance(node, dict):
        return node
    if _KEY not in node:
        return {k: _unpack(v, arrays) for k, v in node.items()}

    def column(name: str, where: list[int]) -> list:
        values = arrays[name][where[0]:where[0] + where[1]].tolist()
        if name in _NAMED_COLUMNS:
            names = arrays[f"names_{name}"].tolist()
            return [names[i] for i in values]
        return [bool(v) for v in values] if name == "overlapped" else values

    columns = [column(name, node[_KEY][name]) for name in node["columns"]]
    trace = {k: v for k, v in node.items() if k not in (_KEY, "$memory")}
    trace["spans"] = [list(row) for row in zip(*columns)]
    trace["memory"] = [np.column_stack([column("memory_time", t), np.cumsum(column("memory_step", b))]).tolist()
                       for t, b in node["$memory"]]
    return trace


def write(path: str | Path, doc: dict) -> None:
    """Save `doc` to `path` (`.npz`: compact; `.json.gz` or `.json`: as JSON), replacing
    it only once the new file is whole, so a run cut short keeps the last one."""
    path = Path(path)
    if path.suffix == ".npz":
        store = _Store()
        header = json.dumps(_pack(doc, store))
        buffer = io.BytesIO()
        np.savez_compressed(buffer, header=np.array(header), **store.arrays())
        data = buffer.getvalue()
    else:
        text = json.dumps(doc).encode()
        data = gzip.compress(text) if path.name.endswith(".gz") else text
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def read(path: str | Path) -> dict:
    """The document saved at `path` by `write` (or by a benchmark before this format)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as stored:
            arrays = {k: stored[k] for k in stored.files}
        arrays["memory_time"] = np.cumsum(arrays["memory_time"]) / 1e6
        return _unpack(json.loads(str(arrays.pop("header"))), arrays)
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)
