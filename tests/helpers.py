"""Small helpers shared by the tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pipesched.schedules.ir import Schedule
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, uniform
from pipesched.simulator.metrics import Metrics, compute_metrics


def run(schedule: Schedule, costs: CostModel | None = None, engine: str = "exact") -> Metrics:
    """Metrics of a schedule simulated under `costs` (default F = B = W = 1)."""
    graph = validate(schedule)
    return compute_metrics(simulate(graph, costs or uniform(), engine=engine), graph)


def makespan(schedule: Schedule, costs: CostModel | None = None, engine: str = "exact") -> float:
    return run(schedule, costs, engine).makespan


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def run_with_receive_takes(schedule: Schedule, costs: CostModel, host_by_rank=None):
    """A simulated 'run' of `schedule` recording what the executor records about receives
    (meta["receive_takes"]: when each consumer began to take its inputs, its rank ready
    after the last op's end, its bookkeeping and sends and the receives posted before
    it; a receive span ending when the data was there and taken), so that host time can
    be read back from it. Returns (graph, trace); exact only with replay.WAIT_MARGIN 0.
    `host_by_rank`: each rank's own host costs (`timing.resolve`)."""
    import numpy as np
    from dataclasses import replace

    from pipesched.schedules.graph import LOCAL
    from pipesched.schedules.ir import OPS
    from pipesched.simulator.exact import longest_path
    from pipesched.simulator.timing import resolve, to_trace
    from pipesched.simulator.trace import RECV

    graph = validate(schedule)
    timing = resolve(graph, costs, host_by_rank=host_by_rank)
    timeline = longest_path(graph, timing)
    trace = to_trace(graph, timing, timeline) if host_by_rank is not None else simulate(graph, costs, engine="exact")
    col = graph.columns()
    first = {ids[0] for ids in graph.rank_units if ids}
    takes, recv = [], replace(trace, end=trace.end.copy())
    for e in np.flatnonzero(col["edge_kind"] != LOCAL):
        src, dst = col["edge_src"][e], col["edge_dst"][e]
        u = col["unit"][dst]
        ready = 0.0 if u in first else timeline.unit_end[u - 1] + timing.host.post[u - 1] + timing.host.pre[u]
        key = (int(col["rank"][dst]), OPS[col["op"][src]], int(col["mb"][src]), int(col["stage"][src]),
               int(col["rank"][src]))
        takes.append([*key, float(ready)])
        span = np.flatnonzero((trace.lane == RECV) & (trace.rank == key[0]) & (trace.peer == key[4])
                              & (trace.op == col["op"][src]) & (trace.mb == key[2]) & (trace.stage == key[3]))[0]
        recv.end[span] = max(timeline.edge_end[e], ready)
    recv.meta["receive_takes"] = takes
    recv.meta["recv_lookahead"] = costs.recv_lookahead
    return graph, recv


def benchmark_module(name: str) -> ModuleType:
    """The script benchmarks/NAME.py imported as a module (its folder on sys.path, as
    when it runs, for its own imports such as `machine`)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
