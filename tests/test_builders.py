"""Every built-in schedule: valid over a grid of (p, m, v), and at its published makespan."""
import pytest

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS, build
from pipesched.simulator.costs import uniform

from helpers import close, makespan, run

COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1), (1.5, 1, 0.5)]


def grid():
    for name, b in BUILDERS.items():
        chunks = [None] if b.chunks is not None else [None, 1, 2] if b.searches else [1, 2, 3]
        for p in (1, 2, 3, 4, 6):
            for m in (1, 2, 3, p, 2 * p - 1, 2 * p, 3 * p + 1):
                for v in chunks:
                    yield name, p, m, v


@pytest.mark.parametrize("name,p,m,v", sorted(set(grid()), key=str))
def test_every_builder_gives_a_valid_graph_or_names_its_constraint(name, p, m, v):
    try:
        schedule = build(name, p, m, v)
    except ScheduleError as exc:
        # the only refusals in this grid are DualPipe's parity rules
        assert name == "dualpipe" and ("even number" in str(exc)), exc
        return
    metrics = run(schedule)
    assert metrics.makespan > 0
    assert schedule.ranks == p and schedule.microbatches == m


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 8), (4, 3), (5, 12), (8, 8)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_steps(name, p, m, f, b, w):
    assert close(makespan(build(name, p, m), uniform(f, b, w)), (m + p - 1) * (f + b + w))


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 12, 3), (8, 16, 2), (3, 6, 2), (1, 3, 4)])
def test_interleaved_bubble_shrinks_by_v(p, m, v, f, b, w):
    expected = m * (f + b + w) + (p - 1) * (f + b + w) / v
    assert close(makespan(build("interleaved-1f1b", p, m, v), uniform(f, b, w)), expected)


@pytest.mark.parametrize("p,m,v", [(4, 5, 2), (4, 10, 2), (4, 11, 3), (3, 4, 2), (8, 20, 3), (4, 2, 2)])
def test_interleaved_accepts_m_not_a_multiple_of_p(p, m, v):
    # never worse than plain 1F1B on the same model
    assert makespan(build("interleaved-1f1b", p, m, v)) <= makespan(build("1f1b", p, m)) + 1e-9


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (4, 13), (8, 16)])
def test_zb_h1_bubble_is_f_plus_b_minus_w(p, m, f, b, w):
    expected = m * (f + b + w) + (p - 1) * (f + b - w)
    assert close(makespan(build("zb-h1", p, m), uniform(f, b, w)), expected)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 24)])
def test_zb_h1_bubble_is_a_third_of_1f1b(p, m):
    one_f = makespan(build("1f1b", p, m)) - 3 * m
    zb = makespan(build("zb-h1", p, m)) - 3 * m
    assert close(zb, one_f / 3)


@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (4, 4), (4, 9), (6, 12), (8, 32)])
def test_zb_h2_has_only_the_start_skew(p, m):
    assert close(makespan(build("zb-h2", p, m)), 3 * m + (p - 1))


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 7), (4, 16), (5, 12), (8, 32)])
def test_zb_v_has_only_the_start_skew(p, m):
    # chunks cost half a pipeline stage: rank p-1 starts after p-1 chunk forwards
    assert close(makespan(build("zb-v", p, m)), 3 * m + (p - 1) / 2)


def dualpipe_bubble(pp: int, f: float, b: float, w: float, overlap: float) -> float:
    """DualPipe README: (PP/2-1)(F&B + B - 3W), B a full backward, F&B the pair."""
    full = b + w
    pair = f + full - overlap * min(f, full)
    return (pp / 2 - 1) * (pair + full - 3 * w)


def worst_idle(name, p, m, overlap):
    return max(r.idle for r in run(build(name, p, m), uniform(1, 1, 1, overlap=overlap)).per_rank)


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 10), (6, 12), (8, 16), (8, 24)])
def test_dualpipe_reaches_its_published_bubble(p, m, overlap):
    assert close(worst_idle("dualpipe", p, m, overlap), dualpipe_bubble(p, 1, 1, 1, overlap))
    if overlap == 0.0:  # every rank then does the same work: makespan = work + bubble
        assert close(makespan(build("dualpipe", p, m)), 3 * m + dualpipe_bubble(p, 1, 1, 1, 0.0))


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 6), (3, 7), (4, 8), (5, 16), (8, 16)])
def test_dualpipev_reaches_its_published_bubble(p, m, overlap):
    # 2p model stages: every chunk op costs half of the pipeline stage's
    assert close(worst_idle("dualpipev", p, m, overlap), dualpipe_bubble(2 * p, 0.5, 0.5, 0.5, overlap))
    if overlap == 0.0:
        assert close(makespan(build("dualpipev", p, m)), 3 * m + dualpipe_bubble(2 * p, 0.5, 0.5, 0.5, 0.0))


def test_reference_numbers_from_torch_checks():
    # facts recorded in shared/reference.md with torch's own orders
    assert close(makespan(build("gpipe", 4, 8)), 33)
    assert close(makespan(build("interleaved-1f1b", 4, 8, 2)), 28.5)
    assert close(makespan(build("dualpipev", 4, 8)), 27)
    assert close(makespan(build("zb-v", 4, 16)), 49.5)


@pytest.mark.parametrize("f,b,w,torch_makespan,beats", [(1, 2, 1, 67.0, False), (2, 3, 1, 102.0, True)])
def test_zb_v_adapts_to_unequal_costs(f, b, w, torch_makespan, beats):
    costs = uniform(f, b, w)
    adapted = makespan(build("zb-v", 4, 16, op_time=costs.op_time_for(4)), costs)
    # torch's hand-written ZBV order, measured with the same evaluator (reference.md)
    assert adapted < torch_makespan if beats else adapted <= torch_makespan
    assert adapted >= 16 * (f + b + w) + 3 * f / 2 - 1e-9  # the start-skew bound
    assert makespan(build("zb-v", 4, 16), costs) == torch_makespan  # the unadapted order is torch's


MEMORY = dict(activation_memory=1.0, param_bytes=10.0)


def peaks(name, p, m, v=None):
    return [r.peak_memory_bytes for r in run(build(name, p, m, v), uniform(1, 1, 1, **MEMORY)).per_rank]


@pytest.mark.parametrize("p,m", [(2, 6), (4, 8), (4, 16)])
def test_activation_memory_of_each_family(p, m):
    params = 10.0
    assert peaks("gpipe", p, m)[0] == params + m
    assert peaks("1f1b", p, m) == [params + p - r for r in range(p)]
    assert max(peaks("zb-h1", p, m)) == params + p
    assert max(peaks("zb-h2", p, m)) <= params + 2 * p - 1
    assert max(peaks("zb-v", p, m)) <= params + p
    # dualpipe holds two replicas: twice the parameters of 1f1b on every rank
    if p % 2 == 0:
        assert all(d - x >= params - 1e-9 for d, x in zip(peaks("dualpipe", p, m), peaks("1f1b", p, m)))
        assert min(peaks("dualpipe", p, m)) >= 2 * params


@pytest.mark.parametrize("name,p,m,v,message", [
    ("dualpipe", 3, 6, None, "dualpipe needs an even number of ranks, got 3"),
    ("dualpipe", 4, 7, None, "even number of microbatches"),
    ("1f1b", 0, 4, None, "1f1b needs ranks >= 1, got 0"),
    ("gpipe", 2, 0, None, "gpipe needs microbatches >= 1, got 0"),
    ("interleaved-1f1b", 2, 4, 0, "v >= 1"),
    ("zb-v", 2, 4, 3, "zb-v has 2 chunks per rank, got -v 3"),
    ("1f1b", 2, 4, 2, "1f1b has 1 chunk per rank, got -v 2"),
    ("nope", 2, 4, None, "unknown schedule 'nope'"),
    ("1f1b", True, 4, None, "ranks >= 1"),
])
def test_builders_name_the_violated_constraint(name, p, m, v, message):
    with pytest.raises(ScheduleError, match=message):
        build(name, p, m, v)
