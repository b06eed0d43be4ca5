"""One call from a schedule and a cost model to a Trace."""
from __future__ import annotations

from schedules.graph import TaskGraph
from schedules.ir import Schedule
from schedules.validate import validate

from .costs import CostModel
from .exact import longest_path
from .timing import resolve, to_trace
from .trace import Trace


def simulate(schedule: Schedule | TaskGraph, costs: CostModel, engine: str = "des", **options) -> Trace:
    """Predict the timeline of `schedule` under `costs`.

    engine "des" runs the discrete-event simulation (simulator.des); "exact" computes
    the longest path (simulator.exact), which needs deterministic costs and no shared
    compute. Both give the same Trace for the same inputs.
    """
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    timing = resolve(graph, costs, **{k: v for k, v in options.items() if k in ("noise_cv", "rng")})
    if engine == "exact":
        timeline = longest_path(graph, timing)
    elif engine == "des":
        from .des import run_des
        timeline = run_des(graph, timing)
    else:
        raise ValueError(f"unknown engine {engine!r}; engines are des, exact")
    meta = {"engine": engine}
    return to_trace(graph, timing, timeline, meta)
