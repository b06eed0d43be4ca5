"""The V's building blocks (schedules.v_pattern) and what zb-auto gains from them: valid
orders within the memory limit, makespans that are the simulated ones, gap filling that
never lengthens a play, and the peers' numbers at V-Min's memory."""
from __future__ import annotations

import math

import pytest

from pipesched.schedules import v_pattern
from pipesched.schedules.activations import peak_activations
from pipesched.schedules.ir import Schedule, looped_stages
from pipesched.schedules.registry import build
from pipesched.schedules.timeline import makespan_under
from pipesched.schedules.v_pattern import (B0, B1, F0, F1, W0, W1, Ops, family, fill_gaps, play, play_ready, slots,
                                           steady_peak, timing, v_pattern_plays)
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import CostModel, StageCost, uniform


def _strict(ops: Ops, table) -> Schedule:
    m = ops.m
    programs = [[(k, i) for _, k, i in sorted((row[k] + 6 * i, k, i) for k in range(6) for i in range(m))]
                for row in table]
    return ops.schedule(programs, "x")


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_a_block_puts_every_op_after_its_input_and_kinds_on_distinct_slots(p):
    tables = family(p, 4 * p, 4 * p)
    assert tables
    for s in tables:
        for r, row in enumerate(s):
            assert len({x % 6 for x in row}) == 6
            assert row[F1] > row[F0] if r == p - 1 else row[F1] > s[r + 1][F1]
            assert row[B1] > (row[F1] if r == 0 else s[r - 1][B1])
            assert row[B0] > (row[B1] if r == p - 1 else s[r + 1][B0])
            assert row[W1] > row[B1] and row[W0] > row[B0]
            if r:
                assert row[F0] > s[r - 1][F0]


@pytest.mark.parametrize("p,m", [(4, 2), (4, 8), (4, 16), (8, 16), (8, 40)])
def test_the_steady_peak_bounds_what_the_strict_order_holds(p, m):
    ops = Ops(p, m, uniform(1, 1, 1).op_time_for(p))
    for table in family(p, m, 4 * p)[:40]:
        s = _strict(ops, table)
        validate(s)
        assert 2 * peak_activations(s) <= steady_peak(table, m) + 1e-9
        if m >= 6 * p:  # long enough to reach the steady state
            assert 2 * peak_activations(s) == steady_peak(table, m)


def test_offsets_that_collide_are_refused():
    assert slots(2, (1, 2, 3), [6]) is None  # rank 1: F0 stays on residue 0, F1 moves back onto it
    assert slots(4, (1, 2, 3), [1, 1, 1]) is not None


COSTS = {
    "equal": uniform(1, 1, 1),
    "b2": uniform(1, 2, 1),
    "f2b3": uniform(2, 3, 1),
    "w0": uniform(1, 1, 0),
    "ms": uniform(12e-3, 14e-3, 10e-3),
}


def _per_stage(p):
    stages = tuple(StageCost(1 + (k % 3) * 0.5, 1 + (k % 2), 0.5 + (k % 4) * 0.25) for k in range(p))
    return CostModel(stages=stages).check()


@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 1), (2, 5), (3, 2), (4, 3), (4, 8), (5, 7)])
@pytest.mark.parametrize("label", [*COSTS, "per-stage"])
def test_plays_are_valid_fit_the_limit_and_time_as_simulated(p, m, label):
    costs = _per_stage(p) if label == "per-stage" else COSTS[label]
    op_time = costs.op_time_for(p)
    for limit in sorted({1, 1.5, (p + 4) // 3, p, 2 * p - 0.5}):
        found = v_pattern_plays(p, m, op_time, limit, keep=2)
        assert found, (p, m, limit)
        assert [t for _, t in found] == sorted(t for _, t in found)
        for s, makespan in found:
            validate(s)
            assert s.name == "zb-auto" and s.params == {"v": 2}
            assert peak_activations(s) <= limit + 1e-9
            assert makespan_under(s, op_time) == makespan


def test_below_one_microbatch_there_is_nothing_to_play():
    assert v_pattern_plays(4, 8, uniform(1, 1, 1).op_time_for(4), 0.5) == []


def test_a_search_whose_screened_ways_are_all_strict_plays_still_finds_orders():
    # Llama-3 70B's estimated stages at p = 4 (the middle one a layer longer) under a
    # limit of 5.5 microbatches: the screen on 3p microbatches keeps only strict plays,
    # and the search on all 32 once stopped with an IndexError.
    f = [41.66, 41.10, 41.10, 45.21, 41.10, 41.10, 41.10, 41.74]
    b = [47.68, 47.68, 47.68, 52.45, 47.68, 47.68, 47.68, 46.96]
    w = [30.90, 30.20, 30.20, 33.22, 30.20, 30.20, 30.20, 30.41]
    table = {"F": f, "B": b, "W": w}

    def op_time(op, model_stage, num_model_stages):
        return table[op][model_stage] * 1e-3
    found = v_pattern_plays(4, 32, op_time, 5.5)
    assert found
    for schedule, makespan in found:
        validate(schedule)
        assert peak_activations(schedule) <= 5.5 + 1e-9
        assert makespan == pytest.approx(makespan_under(schedule, op_time), rel=1e-9)


@pytest.mark.parametrize("fbw", [(1, 1, 1), (2, 3, 1), (12e-3, 14e-3, 10e-3)])
def test_filling_gaps_never_lengthens_a_play_nor_breaks_the_limit(fbw):
    p, m, units = 8, 24, 9
    ops = Ops(p, m, uniform(*fbw).op_time_for(p))
    caps = [units - min(r + 1, units // 2) for r in range(p)]
    tried = 0
    for table in family(p, m, units + 4)[::7]:
        for ready in (False, True):
            if not ready and steady_peak(table, m) > units:
                continue
            played = play(ops, table, units, ready, caps if ready else None)
            assert played is not None
            programs, makespan = played
            assert timing(ops, programs)[0] == makespan
            filled, after = fill_gaps(ops, programs, units, 64)
            assert after <= makespan
            assert timing(ops, filled)[0] == after
            s = ops.schedule(filled, "x")
            validate(s)
            assert 2 * peak_activations(s) <= units
            assert sorted(map(sorted, filled)) == sorted(map(sorted, programs))  # the same ops
            tried += 1
    assert tried > 5


def test_each_kind_keeps_its_microbatch_order():
    p, m = 4, 12
    op_time = uniform(2, 3, 1).op_time_for(p)
    for s, _ in v_pattern_plays(p, m, op_time, 2, keep=2):
        for r, program in enumerate(s.programs):
            for op in "FBW":
                for stage in (r, 2 * p - 1 - r):
                    mbs = [t.mb for t in program if t.op == op and t.stage == stage]
                    assert mbs == sorted(mbs) == list(range(m))


def test_a_remembered_search_gives_new_schedules_with_the_same_order():
    p, m = 4, 8
    op_time = uniform(1, 2, 1).op_time_for(p)
    first = v_pattern_plays(p, m, op_time, 3)
    first[0][0].programs[0].clear()
    again = v_pattern_plays(p, m, op_time, 3)
    assert again[0][0].programs[0] and again[0][1] == first[0][1]
    assert again[0][0] is not first[0][0]


# The peers' schedulers (sail-sg/zero-bubble-pipeline-parallelism: v_auto_schedule, zbv,
# zbv_greedy), run by benchmarks/zb_vs_sailsg.py under the same memory count (F to W) and
# free transfers, reach these; zb-auto before the building blocks took 65, 51.5 and 66.5.
@pytest.mark.parametrize("p,m,fbw,limit,theirs", [
    (4, 16, (1, 1, 1), 2, 53.5),
    (4, 16, (1, 1, 1), 3, 50.5),
    (8, 16, (1, 1, 1), 4, 59.5),
])
def test_zb_auto_at_low_memory_on_two_chunks_matches_the_peers(p, m, fbw, limit, theirs):
    op_time = uniform(*fbw).op_time_for(p)
    s = build("zb-auto", p, m, 2, op_time, max_activations=limit)
    assert peak_activations(s) <= limit
    assert makespan_under(s, op_time) <= theirs * 1.01
    assert makespan_under(s, op_time) <= makespan_under(build("v-min", p, m, None, op_time), op_time) + 1e-9


def test_zb_auto_names_the_building_blocks_it_was_built_from():
    s = build("zb-auto", 4, 16, 2, uniform(1, 1, 1).op_time_for(4), max_activations=2)
    assert s.params["origin"] == "v-shape building blocks at 2"


def test_without_a_limit_zb_auto_plays_no_building_blocks(monkeypatch):
    from pipesched.schedules import zb_auto

    def refuse(*args, **kwargs):
        raise AssertionError("played building blocks without a limit")

    monkeypatch.setattr(zb_auto, "v_pattern_plays", refuse)
    build("zb-auto", 4, 8, 2, uniform(1, 2, 1).op_time_for(4))


def test_the_one_chunk_search_is_unchanged():
    # building blocks are for the V only: one chunk per rank never calls them
    s = build("zb-auto", 4, 8, 1, uniform(1, 2, 1).op_time_for(4), max_activations=3)
    assert s.stages == looped_stages(4, 1) and "building blocks" not in s.params["origin"]


def test_kinds_name_the_ops_of_the_v():
    assert (F0, F1, B1, B0, W1, W0) == tuple(range(6))
    assert v_pattern.OPS == ("F", "F", "B", "B", "W", "W") and v_pattern.CHUNK == (0, 1, 1, 0, 1, 0)


@pytest.mark.parametrize("fbw", [(1, 1, 1), (2, 3, 1)])
def test_ready_plays_together_equal_each_play_alone(fbw):
    # play_ready shares the ops the blocks agree on and copies the state where they part:
    # every play it yields is the one `play` gives that block alone, and a block it
    # leaves out either deadlocks or cannot end by the cutoff
    p, m, units = 6, 18, 7
    ops = Ops(p, m, uniform(*fbw).op_time_for(p))
    caps = [units - min(r + 1, units // 2) for r in range(p)]
    tables = family(p, m, units + 4)[::3]
    alone = [play(ops, t, units, True, caps) for t in tables]
    seen = set()
    for members, programs, makespan in play_ready(ops, tables, units, caps, lambda: math.inf):
        for j in members:
            assert alone[j] == (programs, makespan)
            seen.add(j)
    assert seen == {j for j, got in enumerate(alone) if got is not None} and len(seen) > 3


@pytest.mark.parametrize("fbw, p, m, units", [((1, 1, 1), 6, 18, 7), ((2, 3, 1), 4, 12, 5),
                                             ((1.3, 2.7, 0.9), 5, 15, 9), ((0.012, 0.014, 0.01), 8, 24, 11)])
def test_ready_plays_side_by_side_equal_each_play_alone(fbw, p, m, units):
    # Lockstep advances every ready play at once with numpy: each play must end with the
    # programs and makespan (the same floats) that `play` gives its block alone, and
    # deadlock where `play` does
    from pipesched.schedules.v_lockstep import Lockstep
    ops = Ops(p, m, uniform(*fbw).op_time_for(p))
    caps = [units - min(r + 1, units // 2) for r in range(p)]
    tables = family(p, m, units + 4)
    lock = Lockstep(ops, tables, units, caps)
    ended = 0
    for j, table in enumerate(tables):
        alone = play(ops, table, units, True, caps)
        if alone is None:
            assert math.isnan(lock.makespans[j])
        else:
            assert (lock.programs(j), float(lock.makespans[j])) == alone
            ended += 1
    assert ended > 3


def test_a_search_finds_the_same_orders_side_by_side_as_one_by_one(monkeypatch):
    # v_pattern_plays keeps the fastest ready plays: run side by side (all at once, or a
    # few at a time) or one by one, the same orders and makespans
    from pipesched.schedules import v_lockstep
    op_time = uniform(0.012, 0.014, 0.010).op_time_for(8)
    found, runs = [], []
    monkeypatch.setattr(v_pattern, "Lockstep", lambda *args: runs.append(len(args[1])) or v_lockstep.Lockstep(*args))
    for start, at_once in ((v_lockstep.LOCKSTEP_FROM, v_lockstep.LOCKSTEP_OPS), (v_lockstep.LOCKSTEP_FROM, 6000),
                           (10 ** 9, 0)):
        monkeypatch.setattr(v_pattern, "LOCKSTEP_FROM", start)
        monkeypatch.setattr(v_pattern, "LOCKSTEP_OPS", at_once)
        v_pattern._REMEMBERED.clear()
        found.append([(s.programs, t) for s, t in v_pattern_plays(8, 40, op_time, 6.5)])
    assert max(runs) > 12 and min(runs) <= 6000 // (6 * 8 * 24)  # all at once, and a few at a time
    assert found[0] == found[1] == found[2] and found[0]
