"""How sure a predicted pick is: the predicted gap between schedules against how far
predictions of those schedules are known to miss, and in which direction.

One calibration predicts every schedule; its error differs by schedule kind, in size and
in sign (with a core per rank looped BFS and ZB-V come out long, GPipe and 1F1B short;
with two ranks a core DualPipe and interleaved 1F1B come out short, 1F1B and GPipe long).
The table holds, per schedule, the 5th and the 95th percentile of the makespan error
(predicted / measured - 1) of `validate A,B,...` of all nine built-ins on models drawn
fresh, under today's cost model (the step residual held against each step's own op times):
59 launches at p = 2 with a core per rank and 36 at p = 4 with two ranks a core (2-core
VMs, torch 2.13.0 CPU, gloo, 2026-11-29; `benchmarks/known_errors.py`, the launches in
docs/accuracy.md).

A pick P is settled over a schedule S when S would still measure slower with P as far
short as its 5th percentile and S as far long as its 95th:
pred_S / pred_P - 1 > (1 + high_S) / (1 + low_P) - 1, the lead needed.
A launch's own repeatability is a floor under that lead: where it measured one schedule
twice (`validate` runs its calibration's schedules again), how far those two runs were
apart, and how far the two halves of any run's steps (even against odd) were apart: on a
launch whose run halves came out 21.6 % apart, the pick measured 9.4 % slower than the
fastest (seed 2097, docs/accuracy.md). A schedule not in the table (V-Half, V-Min,
zb-auto, a file) gets the widest range of the two-chunk schedules. Wide percentiles on
purpose: a user who measures only what the command names should not end with a schedule
much slower than the fastest, and narrower ones let an outlier through (docs/accuracy.md,
"How sure a pick is", has how each held out).

    | schedule         | a core per rank   | two ranks a core  |
    |------------------|-------------------|-------------------|
    | 1f1b             |   -6.2 %   +3.1 % |   -8.3 %  +10.9 % |
    | zb-h1            |   -7.4 %   +3.7 % |   -7.4 %   +6.4 % |
    | zb-h2            |   -4.0 %   +6.3 % |   -6.3 %   +7.3 % |
    | gpipe            |   -6.2 %   +3.6 % |   -3.3 %   +8.5 % |
    | interleaved-1f1b |   -4.0 %   +4.4 % |  -12.9 %   +4.2 % |
    | looped-bfs       |   -4.8 %  +10.2 % |  -11.8 %   +3.6 % |
    | zb-v             |   -3.5 %   +7.8 % |   -9.1 %   +4.3 % |
    | dualpipe         |   -4.4 %   +5.1 % |  -12.7 %   +1.0 % |
    | dualpipev        |   -6.2 %   +3.7 % |   -4.8 %   +4.5 % |
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

Range = tuple[float, float]  # (5th, 95th percentile) of predicted / measured - 1

#: schedule -> ((low, high) with a core per rank, (low, high) with two ranks a core)
KNOWN_ERROR: dict[str, tuple[Range, Range]] = {
    "1f1b": ((-0.0619, +0.0307), (-0.0831, +0.1095)),
    "zb-h1": ((-0.0739, +0.0366), (-0.0738, +0.0642)),
    "zb-h2": ((-0.0396, +0.0630), (-0.0626, +0.0727)),
    "gpipe": ((-0.0615, +0.0362), (-0.0326, +0.0848)),
    "interleaved-1f1b": ((-0.0403, +0.0440), (-0.1286, +0.0420)),
    "looped-bfs": ((-0.0479, +0.1024), (-0.1177, +0.0365)),
    "zb-v": ((-0.0348, +0.0784), (-0.0912, +0.0428)),
    "dualpipe": ((-0.0444, +0.0508), (-0.1268, +0.0102)),
    "dualpipev": ((-0.0623, +0.0372), (-0.0478, +0.0450)),
}
TWO_CHUNK = ("interleaved-1f1b", "zb-v", "dualpipev")


def known_error(schedule: str, shared_cores: bool, known: Mapping[str, tuple[Range, Range]] | None = None) -> Range:
    """(low, high): how far short (low < 0) and how far long (high > 0) predictions of
    `schedule` are known to come out, as fractions of the measured makespan (5th and
    95th percentile, 2-core CPUs with gloo); `shared_cores`: ranks share cores; `known`:
    another table of the same form (KNOWN_ERROR by default). A schedule not in it gets
    the widest range of the two-chunk schedules."""
    table = KNOWN_ERROR if known is None else known
    i = 1 if shared_cores else 0
    if schedule in table:
        return table[schedule][i]
    two = [table[s][i] for s in TWO_CHUNK if s in table] or [r[i] for r in table.values()]
    return min(r[0] for r in two), max(r[1] for r in two)


def needed_lead(pick: str, other: str, shared_cores: bool = False, floor: float = 0.0,
                known: Mapping[str, tuple[Range, Range]] | None = None) -> float:
    """The predicted lead (fraction) `pick` needs over `other` to be measured ahead of it
    even with `pick` predicted as short and `other` as long as their records say,
    (1 + high of other) / (1 + low of pick) - 1, and at least `floor`."""
    low = known_error(pick, shared_cores, known)[0]
    high = known_error(other, shared_cores, known)[1]
    return max(floor, (1 + high) / (1 + low) - 1)


@dataclass(frozen=True)
class Confidence:
    """The predicted pick against its runners-up. `gap`: how much longer (fraction) the
    second-fastest is predicted than the pick; `error`: the lead the pick needs over it
    (`needed_lead`); `settled`: gap > error; `to_measure`: the pick and every schedule
    whose predicted lead over it is within the lead needed, fastest predicted first;
    `floor`: the launch's own repeatability every needed lead was raised to (0: none
    given)."""

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


def pick_confidence(predicted: dict[str, float], shared_cores: bool = False, floor: float = 0.0,
                    known: Mapping[str, tuple[Range, Range]] | None = None) -> Confidence:
    """How sure the pick among `predicted` (schedule name -> predicted makespan, seconds,
    all positive) is; `floor` (a fraction >= 0): how far two runs of one schedule, or the
    two halves of one run's steps, in the same launch were apart, the least lead taken to
    settle anything; `known`: the record (KNOWN_ERROR by default). ValueError for an empty
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
        return Confidence(pick, None, float("inf"), needed_lead(pick, pick, shared_cores, floor, known), True,
                          (pick,), floor)

    def needed(name: str) -> float:
        return needed_lead(pick, name, shared_cores, floor, known)

    def lead(name: str) -> float:
        return predicted[name] / predicted[pick] - 1

    close = tuple(n for n in order[1:] if lead(n) <= needed(n))
    runner = order[1]
    return Confidence(pick, runner, lead(runner), needed(runner), lead(runner) > needed(runner), (pick, *close), floor)
