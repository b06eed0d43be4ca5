"""One call from a schedule and a cost model to a Trace."""
from __future__ import annotations

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import Schedule
from pipesched.schedules.validate import gc_paused, validate

from .costs import CostModel
from .des import run_des
from .exact import longest_path
from .timing import resolve, to_trace
from .trace import Trace


def simulate(schedule: Schedule | TaskGraph, costs: CostModel, engine: str = "des", **options) -> Trace:
    """Predict the timeline of `schedule` under `costs`.

    engine "des" runs the discrete-event simulation (simulator.des); "exact" computes
    the longest path (simulator.exact), which cannot share compute between ranks
    (`costs.host`). Both give the same Trace for the same inputs (to 1e-9), so "auto"
    runs the exact engine, much the faster, unless ranks share compute. The Trace's
    meta names the engine that ran ("engine") and, for "auto", that it was chosen.
    options: noise_cv and rng (see simulator.timing.resolve).
    """
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    with gc_paused():  # the DES allocates millions of acyclic objects; collections would rescan them
        return _simulate(graph, costs, engine, **options)


def _simulate(graph: TaskGraph, costs: CostModel, engine: str, **options) -> Trace:
    timing = resolve(graph, costs, **{k: v for k, v in options.items() if k in ("noise_cv", "rng")})
    meta = {}
    if engine == "auto":
        engine = "des" if costs.host is not None else "exact"
        meta["engine_choice"] = "auto: " + ("ranks share compute" if engine == "des" else
                                            "no ranks share compute; the DES gives the same timeline")
    if engine == "exact":
        if costs.host is not None:
            raise ValueError("the exact engine cannot model ranks sharing compute; use the DES")
        timeline = longest_path(graph, timing)
    elif engine == "des":
        timeline = run_des(graph, timing, costs.host)
    else:
        raise ValueError(f"unknown engine {engine!r}; engines are auto, des, exact")
    meta = {"engine": engine, **meta}
    if costs.host is not None:
        meta["shared_compute"] = {"capacity": costs.host.capacity, "compute_demand": costs.host.compute_demand,
                                  "wait_demand": costs.host.wait_demand}
    return to_trace(graph, timing, timeline, meta)
