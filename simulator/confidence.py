"""How sure a predicted pick is: the predicted gap between schedules against the error
the cost model is known to have for them.

One calibration predicts every schedule; its error differs by schedule kind (chunks of
half a stage, V placements and DualPipe's two directions err more than the 1F1B and ZB-H1
runs it was calibrated on). The table is the 75th percentile of |makespan error| of the
default prediction (op times from runs) per schedule on models drawn fresh (seeds
2077-2079, 36 runs of each schedule per p, 2-core VMs, torch 2.13.0 CPU, gloo; measured
2026-11-27, `benchmarks/accuracy_random.py`): p = 2 has a core per rank, p = 4 two ranks
a core. A schedule not in the table (V-Half, V-Min, zb-auto, a file) gets the largest
error of the two-chunk schedules. A pick whose predicted lead over a runner-up is within
the larger of their known errors is not settled by the prediction: measure both. Where a
launch measured one schedule twice (`validate` runs its calibration's schedules again),
how far those two runs were apart is a floor under every error of that launch.

    | schedule         | own cores | shared cores |
    |------------------|-----------|--------------|
    | 1f1b             |   2.8 %   |    3.1 %     |
    | zb-h1            |   2.8 %   |    3.1 %     |
    | zb-h2            |   3.5 %   |    4.8 %     |
    | gpipe            |   7.2 %   |    7.0 %     |
    | interleaved-1f1b |   6.6 %   |   14.8 %     |
    | looped-bfs       |  10.1 %   |   18.2 %     |
    | zb-v             |   6.9 %   |    7.4 %     |
    | dualpipe         |   8.4 %   |   14.2 %     |
    | dualpipev        |   6.3 %   |    7.3 %     |
"""
from __future__ import annotations

from dataclasses import dataclass

#: schedule -> (|error| p75 with a core per rank, with two ranks a core), fractions
KNOWN_ERROR: dict[str, tuple[float, float]] = {
    "1f1b": (0.028, 0.031), "zb-h1": (0.028, 0.031), "zb-h2": (0.035, 0.048), "gpipe": (0.072, 0.070),
    "interleaved-1f1b": (0.066, 0.148), "looped-bfs": (0.101, 0.182), "zb-v": (0.069, 0.074),
    "dualpipe": (0.084, 0.142), "dualpipev": (0.063, 0.073),
}
_UNKNOWN = tuple(max(KNOWN_ERROR[s][i] for s in ("interleaved-1f1b", "zb-v", "dualpipev")) for i in (0, 1))


def known_error(schedule: str, shared_cores: bool) -> float:
    """The fraction by which a prediction of `schedule` is known to miss (75th percentile,
    2-core CPUs with gloo); `shared_cores`: ranks share cores."""
    return KNOWN_ERROR.get(schedule, _UNKNOWN)[1 if shared_cores else 0]


@dataclass(frozen=True)
class Confidence:
    """The predicted pick against its runners-up. `gap`: how much longer (fraction) the
    second-fastest is predicted than the pick; `error`: the larger known error of the two;
    `settled`: gap > error; `to_measure`: the pick and every schedule whose predicted lead
    over it is within their larger known error, fastest predicted first; `floor`: the
    launch's own repeatability every error was raised to (0: none given)."""

    pick: str
    runner_up: str | None
    gap: float
    error: float
    settled: bool
    to_measure: tuple[str, ...]
    floor: float = 0.0

    @property
    def by_floor(self) -> bool:
        """Whether the launch's floor, not the known errors, set `error`."""
        return self.floor > 0 and self.floor >= self.error

    def to_dict(self) -> dict:
        return {"pick": self.pick, "runner_up": self.runner_up, "gap": self.gap, "error": self.error,
                "settled": self.settled, "to_measure": list(self.to_measure), "floor": self.floor,
                "by_floor": self.by_floor}


def pick_confidence(predicted: dict[str, float], shared_cores: bool = False, floor: float = 0.0) -> Confidence:
    """How sure the pick among `predicted` (schedule name -> predicted makespan, seconds,
    all positive) is; `floor` (a fraction >= 0): how far two runs of one schedule in the
    same launch were apart, the least any error is taken to be. ValueError for an empty
    or non-positive input or a bad floor."""
    if not predicted:
        raise ValueError("no predicted makespans to rank")
    if any(not t > 0 for t in predicted.values()):
        raise ValueError(f"predicted makespans must be positive seconds, got {predicted}")
    if not 0 <= floor < float("inf"):
        raise ValueError(f"floor must be a finite fraction >= 0, got {floor!r}")
    order = sorted(predicted, key=predicted.__getitem__)
    pick = order[0]
    if len(order) == 1:
        return Confidence(pick, None, float("inf"), max(floor, known_error(pick, shared_cores)), True, (pick,), floor)

    def error(name: str) -> float:
        return max(floor, known_error(pick, shared_cores), known_error(name, shared_cores))

    def lead(name: str) -> float:
        return predicted[name] / predicted[pick] - 1

    close = tuple(n for n in order[1:] if lead(n) <= error(n))
    runner = order[1]
    return Confidence(pick, runner, lead(runner), error(runner), lead(runner) > error(runner), (pick, *close), floor)
