"""Memory-controllable schedules: V-Half, V-Min and zb-auto against their memory limits
and the published bubbles (Qi et al., "Pipeline Parallelism with Controllable Memory")."""
import pytest

from pipesched.schedules.activations import activations_per_rank, peak_activations
from pipesched.schedules.bounded import Play, play_bounded
from pipesched.schedules.ir import B, BW, F, ScheduleError, uniform_paths, v_stages
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import uniform
from pipesched.schedules.timeline import makespan_under


def published_bubble(schedule, f=1.0, b=1.0, w=1.0):
    """The paper's bubble rate: 1 - m(F+B+W) / makespan (F, B, W per pipeline stage)."""
    ms = makespan_under(schedule, uniform(f, b, w).op_time_for(schedule.ranks))
    return 1 - schedule.microbatches * (f + b + w) / ms


def test_activations_count_microbatches_of_one_pipeline_stage():
    # 1F1B: rank r holds p - r; GPipe holds every microbatch; a V chunk counts a half
    assert activations_per_rank(build("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert peak_activations(build("gpipe", 4, 8)) == 8
    assert peak_activations(build("zb-h2", 4, 8)) == 7       # 2p - 1
    assert peak_activations(build("zb-v", 4, 8)) == 4        # as 1F1B


@pytest.mark.parametrize("p", [4, 8, 12, 16])
@pytest.mark.parametrize("k", [2, 4])
def test_v_half_holds_half_of_1f1b_with_the_published_bubble(p, k):
    m = k * p
    s = build("v-half", p, m)
    validate(s)
    assert peak_activations(s) == (p + 2) // 2
    assert published_bubble(s) <= p / (2 * m)


@pytest.mark.parametrize("p", [4, 8, 12, 16])
def test_v_min_holds_a_third_of_1f1b(p):
    s = build("v-min", p, 2 * p)
    validate(s)
    assert peak_activations(s) == (p + 4) // 3


@pytest.mark.parametrize("p", [4, 8])
def test_v_min_has_the_published_bubble_at_m_2p(p):
    # with more microbatches it stays above 2p/3m (see schedules/v_min.py)
    m = 2 * p
    assert published_bubble(build("v-min", p, m)) <= 2 * p / (3 * m)


def test_bounded_play_admits_whole_microbatches_and_never_deadlocks():
    # greedy.play caps op by op and deadlocks on a V at 3 microbatches; admission does not
    for p, m, limit in ((4, 8, 1), (4, 8, 3), (5, 11, 2), (8, 16, 1.5)):
        stages = v_stages(p)
        paths, mb_paths = uniform_paths(stages, m)
        for prefer in ("alternate", "backward", "forward"):
            s = play_bounded("x", p, m, stages, paths, mb_paths, Play(limit, prefer))
            validate(s)
            assert peak_activations(s) <= limit


def test_bounded_play_refuses_a_limit_below_one_microbatch():
    stages = v_stages(3)
    paths, mb_paths = uniform_paths(stages, 4)
    with pytest.raises(ScheduleError, match="one microbatch holds 1"):
        play_bounded("x", 3, 4, stages, paths, mb_paths, Play(0.5))


COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1)]


@pytest.mark.parametrize("fbw", COSTS)
def test_zb_auto_at_1f1b_memory_beats_zb_v_and_zb_h1(fbw):
    p, m = 4, 16
    op_time = uniform(*fbw).op_time_for(p)
    auto = build("zb-auto", p, m, None, op_time, max_activations=p)
    assert peak_activations(auto) <= p
    best = makespan_under(auto, op_time)
    for name in ("zb-v", "zb-h1", "1f1b"):
        assert best <= makespan_under(build(name, p, m, None, op_time), op_time) + 1e-9


@pytest.mark.parametrize("fbw", COSTS)
def test_zb_auto_at_v_half_memory_is_not_slower_than_v_half(fbw):
    p, m = 6, 12
    op_time = uniform(*fbw).op_time_for(p)
    auto = build("zb-auto", p, m, 2, op_time, max_activations=(p + 2) // 2)
    assert peak_activations(auto) <= (p + 2) // 2
    assert makespan_under(auto, op_time) <= makespan_under(build("v-half", p, m, None, op_time), op_time) + 1e-9


@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 8)])
@pytest.mark.parametrize("fbw", COSTS)
@pytest.mark.parametrize("limit", ["p", "half", None])
def test_zb_auto_is_at_least_as_fast_as_every_built_in_that_fits(p, m, fbw, limit):
    limit = {"p": p, "half": (p + 2) // 2, None: None}[limit]
    op_time = uniform(*fbw).op_time_for(p)
    auto = build("zb-auto", p, m, None, op_time, max_activations=limit)
    validate(auto)
    assert limit is None or peak_activations(auto) <= limit
    best = makespan_under(auto, op_time)
    for name, builder in BUILDERS.items():
        if builder.searches or name == "dualpipe":  # two replicas of each stage: another layout
            continue
        for v in ((1, 2) if builder.chunks is None else (None,)):
            try:
                s = build(name, p, m, v, op_time)
            except ScheduleError:
                continue
            if limit is None or peak_activations(s) <= limit:
                assert best <= makespan_under(s, op_time) + 1e-9, (name, v)


def test_zb_auto_refuses_what_cannot_fit_and_v_beyond_two():
    with pytest.raises(ScheduleError, match="at least one microbatch"):
        build("zb-auto", 4, 8, None, None, max_activations=0.5)
    with pytest.raises(ScheduleError, match="-v 1 or -v 2"):
        build("zb-auto", 4, 8, 3)


def test_zb_auto_names_what_it_was_built_from():
    s = build("zb-auto", 4, 8, 1, None, max_activations=2)
    assert s.name == "zb-auto" and s.params["v"] == 1 and "origin" in s.params
    assert all(t.op in (F, B, BW, "W") for t in s.tasks())


@pytest.mark.parametrize("placement", ["v", "looped1", "looped2"])
@pytest.mark.parametrize("how", [Play(2), Play(2, "backward", reserve=True), Play(3, "forward", eager_w=True)])
def test_a_play_reports_the_makespan_the_exact_engine_gives_its_programs(placement, how):
    from pipesched.schedules.bounded import play_timed
    from pipesched.schedules.ir import looped_stages

    p, m = 4, 9
    stages = {"v": v_stages(p), "looped1": looped_stages(p, 1), "looped2": looped_stages(p, 2)}[placement]
    paths, mb_paths = uniform_paths(stages, m)
    for fbw in COSTS:
        op_time = uniform(*fbw).op_time_for(p)
        s, played = play_timed("x", p, m, stages, paths, mb_paths, how, op_time)
        assert played == pytest.approx(makespan_under(s, op_time), rel=1e-12)
