"""Small helpers shared by the tests."""
from __future__ import annotations

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
