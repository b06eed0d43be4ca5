"""The shortcuts that make searching cheap must not change what the search returns:
remembered plays, the exact lower bound that stops zb-auto's play-outs early, and the
sweep handing zb-auto the built-ins (and evaluations) it already has."""
from __future__ import annotations

import pytest

import pipesched as ps
from pipesched.schedules.bounded import Play, exact_bound, play_timed
from pipesched.schedules.ir import looped_stages, uniform_paths, v_stages
from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.budget import Budget, build_within
from pipesched.simulator.costs import CostModel, uniform
from pipesched.simulator.metrics import compute_metrics


def _programs(schedule):
    return [list(p) for p in schedule.programs]


@pytest.mark.parametrize("fbw", [(1, 1, 1), (1, 2, 1), (12e-3, 14e-3, 10e-3)])
def test_a_remembered_play_is_a_fresh_schedule_with_the_same_order(fbw):
    p, m = 4, 8
    stages = v_stages(p)
    paths, mb_paths = uniform_paths(stages, m)
    op_time = uniform(*fbw).op_time_for(p)
    first, t1 = play_timed("a", p, m, stages, paths, mb_paths, Play(p), op_time, {"v": 2})
    first.programs[0].clear()  # a caller changing its copy changes nothing remembered
    again, t2 = play_timed("b", p, m, stages, paths, mb_paths, Play(p), op_time, {"x": 1})
    assert again.name == "b" and again.params == {"x": 1} and t1 == t2
    assert again.programs[0] and again.programs is not first.programs
    # under other durations it is played anew
    other, _ = play_timed("c", p, m, stages, paths, mb_paths, Play(p), uniform(3, 1, 1).op_time_for(p))
    assert _programs(other) != _programs(again)


def test_a_limit_no_rank_reaches_plays_as_no_limit():
    p, m = 4, 3  # a rank holds at most m microbatches
    for stages in (looped_stages(p, 1), v_stages(p)):
        paths, mb_paths = uniform_paths(stages, m)
        at_m = play_timed("x", p, m, stages, paths, mb_paths, Play(m, reserve=True), None)[0]
        loose = play_timed("x", p, m, stages, paths, mb_paths, Play(100.0), None)[0]
        assert _programs(at_m) == _programs(loose)


@pytest.mark.parametrize("fbw", [(1, 1, 1), (1, 2, 1), (2, 3, 1)])
def test_no_play_beats_the_exact_bound(fbw):
    p, m = 4, 8
    op_time = uniform(*fbw).op_time_for(p)
    for stages in (looped_stages(p, 1), v_stages(p), looped_stages(p, 2)):
        paths, mb_paths = uniform_paths(stages, m)
        bound = exact_bound(p, m, stages, paths, mb_paths, op_time)
        assert bound is not None
        times = [play_timed("x", p, m, stages, paths, mb_paths, Play(limit, prefer, reserve=r), op_time)[1]
                 for limit in (p, 2 * p - 1) for prefer in ("alternate", "backward", "forward") for r in (False, True)]
        assert min(times) >= bound
    # F,B,W = 1,1,1 on one stage per rank: 1F1B-like plays reach it (p-1 forwards, then m*3 of work)
    stages = looped_stages(p, 1)
    paths, mb_paths = uniform_paths(stages, m)
    assert exact_bound(p, m, stages, paths, mb_paths, uniform(1, 1, 1).op_time_for(p)) == (p - 1) + 3 * m


def test_the_bound_is_withheld_when_sums_may_round():
    p, m = 4, 8
    stages = v_stages(p)
    paths, mb_paths = uniform_paths(stages, m)
    assert exact_bound(p, m, stages, paths, mb_paths, uniform(12e-3, 14e-3, 10e-3).op_time_for(p)) is None


def test_zb_auto_in_a_sweep_is_the_schedule_it_is_alone():
    costs = CostModel().check()
    p, counts = 4, [4, 8]
    for v in (1, 2):
        rows = ps.sweep(p, counts, ["gpipe", "1f1b", "interleaved-1f1b", "zb-h2", "zb-v", "v-half", "v-min", "zb-auto"],
                        costs=costs, chunks=v, engine="exact")
        for m in counts:
            alone = build_within("zb-auto", p, m, v, costs, Budget())
            row = next(r for r in rows if r.point.schedule == "zb-auto" and r.point.microbatches == m)
            assert row.point.makespan == compute_metrics(simulate(alone, costs, engine="exact")).makespan


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipe", "interleaved-1f1b"])
def test_the_makespan_a_search_ranks_by_is_the_simulated_one(name):
    from pipesched.simulator.api import exact_makespan
    from pipesched.simulator.costs import Link, Network

    costs = uniform(1e-3, 2e-3, 1e-3, activation_bytes=8e6, activation_memory=1e8, overlap=0.5,
                    network=Network(Link(2e-5, 1e10)))
    schedule = build(name, 4, 8)
    assert exact_makespan(schedule, costs) == compute_metrics(simulate(schedule, costs, engine="exact")).makespan


def test_a_play_with_a_cutoff_is_dropped_only_when_it_would_end_after_it():
    from pipesched.schedules import bounded

    p, m = 4, 8
    stages = v_stages(p)
    paths, mb_paths = uniform_paths(stages, m)
    op_time = uniform(1, 2, 1).op_time_for(p)
    how = Play(p, "forward", eager_w=True)
    bounded._PLAYED.items.clear()  # play it, do not recall it
    bounded._PLAYED.ops = 0
    whole, makespan = play_timed("x", p, m, stages, paths, mb_paths, how, op_time)
    bounded._PLAYED.items.clear()
    bounded._PLAYED.ops = 0
    assert play_timed("x", p, m, stages, paths, mb_paths, how, op_time, cutoff=makespan * 0.99) is None
    same, again = play_timed("x", p, m, stages, paths, mb_paths, how, op_time, cutoff=makespan)
    assert again == makespan and _programs(same) == _programs(whole)
