"""The cost-adaptive builders and the greedy play-out return exactly the orders they
returned before the search was made fast (tests/data/builder_orders.json, written by
the code of commit f83d19d with `python tests/test_builder_orders.py --write`).

Each case is a builder or a `play` rule at some p, m and op durations; the fixture keeps
a digest of every rank's program, so any change of order, however small, fails."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from pipesched.schedules.greedy import PREFERENCES, Rule, play
from pipesched.schedules.ir import Schedule, ScheduleError, looped_stages, uniform_paths, v_stages
from pipesched.schedules.registry import build
from pipesched.simulator.costs import CostModel, StageCost, uniform

FIXTURE = Path(__file__).parent / "data" / "builder_orders.json"
RATIOS = {"equal": (1, 1, 1), "b2": (1, 2, 1), "f2b3": (2, 3, 1), "w-half": (1.5, 1, 0.5), "w0": (1, 1, 0),
          "ms": (1e-3, 2e-3, 1e-3)}


def digest(schedule: Schedule) -> str:
    text = "|".join(" ".join(map(str, program)) for program in schedule.programs)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def op_times(p: int):
    """(label, op_time or None): unit defaults, uniform ratios, per-stage costs, overheads."""
    yield "none", None
    for label, (f, b, w) in RATIOS.items():
        yield label, uniform(f, b, w).op_time_for(p)
    stages = tuple(StageCost(1 + (k % 3) * 0.5, 1 + (k % 2), 0.5 + (k % 4) * 0.25) for k in range(p))
    yield "per-stage", CostModel(stages=stages).check().op_time_for(p)
    yield "overhead", uniform(1, 2, 1, op_overhead=0.3).op_time_for(p)


def cases():
    """(case name, function building its schedule)."""
    for p in (1, 2, 3, 4, 6, 8):
        for m in sorted({1, 2, 3, p, 2 * p - 1, 2 * p, 3 * p + 1}):
            for label, op_time in op_times(p):
                for name in ("zb-h2", "zb-v"):
                    yield f"{name} p={p} m={m} {label}", lambda n=name, p=p, m=m, t=op_time: build(n, p, m, op_time=t)
            for label, op_time in list(op_times(p))[:3]:
                for prefer in PREFERENCES:
                    for layout, stages, limit, split in (("v", v_stages(p), p, True), ("v", v_stages(p), 1.5, True),
                                                         ("looped2", looped_stages(p, 2), p, False),
                                                         ("looped1", looped_stages(p, 1), 2 * p - 1, True)):
                        yield (f"play {layout} p={p} m={m} {label} {prefer} limit={limit} split={split}",
                               lambda p=p, m=m, t=op_time, s=stages, prefer=prefer, limit=limit, split=split:
                               play("x", p, m, s, *uniform_paths(s, m),
                                    Rule(memory_limit=lambda r: limit, prefer=prefer, split=split), t))


def outcome(make) -> str:
    try:
        return digest(make())
    except ScheduleError as exc:
        return f"refused: {str(exc)[:40]}"


def test_the_searches_return_the_orders_they_returned_before():
    expected = json.loads(FIXTURE.read_text())
    got = {name: outcome(make) for name, make in cases()}
    assert set(got) == set(expected)
    changed = [name for name in got if got[name] != expected[name]]
    assert not changed, f"{len(changed)} of {len(got)} orders changed, e.g. {changed[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.write_text(json.dumps({name: outcome(make) for name, make in cases()}, indent=0, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
