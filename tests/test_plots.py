"""Figures draw what the trace holds: artists counted per kind against the trace's spans."""
import dataclasses

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.text import Text

from pipesched.plots import FigureError
from pipesched.plots.compare import plot_compare
from pipesched.plots.sweep import SweepPoint, pareto_front, plot_sweep
from pipesched.plots.timeline import plot_timeline
from pipesched.schedules.ir import OPS
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import Link, Network, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.trace import COMPUTE, RECV, SEND, TraceError

COSTS = uniform(1, 1, 1, activation_bytes=1e6, activation_memory=1e9, weight_memory=4e8, param_bytes=2e9,
                network=Network(Link(0.05, 1e7)))


def trace_of(name, p=4, m=8, costs=COSTS):
    return simulate(validate(build(name, p, m, op_time=costs.op_time_for(p))), costs)


def artists(fig):
    """gid -> artist of the timeline axes (the first one)."""
    ax = fig.axes[0]
    found = {c.get_gid(): c for c in ax.collections if c.get_gid()}
    found["labels"] = [t for t in ax.texts if t.get_gid() == "label"]
    return found


def drawn(artist):
    return len(artist.get_paths()) if isinstance(artist, PolyCollection) else len(artist.get_segments())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_schedule_draws_one_box_per_span(name):
    trace = trace_of(name)
    found = artists(plot_timeline(trace))
    comp = trace.lane == COMPUTE
    for i, op in enumerate(OPS):
        expected = int((comp & ~trace.overlapped & (trace.op == i)).sum())
        assert (drawn(found[f"compute:{op}"]) if f"compute:{op}" in found else 0) == expected, op
    assert (drawn(found["pair"]) if "pair" in found else 0) == int((comp & trace.overlapped).sum())
    assert drawn(found["send"]) == int((trace.lane == SEND).sum()) > 0
    assert drawn(found["recv"]) == int((trace.lane == RECV).sum())
    assert drawn(found["arrows"]) == int((trace.lane == SEND).sum())
    # at p=4, m=8 every op has room for its number
    labels = found["labels"]
    assert len(labels) == int(comp.sum())
    assert sorted(int(t.get_text()) for t in labels) == sorted(trace.mb[comp].tolist())


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipe"])
def test_idle_boxes_cover_exactly_the_idle_time(name):
    trace = trace_of(name)
    idle = artists(plot_timeline(trace))["idle"]
    width = sum(np.ptp(path.vertices[:, 0]) for path in idle.get_paths())
    assert width == pytest.approx(sum(r.idle for r in compute_metrics(trace).per_rank))


def test_memory_panel_has_a_line_per_rank_and_title_says_makespan_and_bubble():
    trace = trace_of("zb-h1")
    fig = plot_timeline(trace)
    assert len(fig.axes[1].get_lines()) == trace.ranks
    m = compute_metrics(trace)
    title = fig._suptitle.get_text()
    assert "zb-h1" in title and "p=4" in title and "m=8" in title
    assert f"{100 * m.bubble_ratio:.1f} %" in title and f"{m.makespan:.6g}" in title


def test_free_communication_draws_no_lanes_or_arrows():
    found = artists(plot_timeline(trace_of("1f1b", costs=uniform())))
    assert not {"send", "recv", "arrows"} & set(found)


def test_large_pipeline_thins_labels_to_every_kth_microbatch_without_overlap():
    trace = trace_of("1f1b", 16, 64)
    fig = plot_timeline(trace)
    found = artists(fig)
    assert drawn(found["compute:BW"]) == 16 * 64 and "arrows" not in found  # too many to draw as lines
    labels = found["labels"]
    mbs = {int(t.get_text()) for t in labels}
    stride = np.gcd.reduce(sorted(mbs - {0}))
    assert 0 < len(labels) < int((trace.lane == COMPUTE).sum()) / 4 and stride > 1
    renderer = FigureCanvasAgg(fig).get_renderer()
    rows: dict[float, list] = {}
    for t in labels:
        rows.setdefault(round(t.get_position()[1], 3), []).append(t.get_window_extent(renderer))
    for boxes in rows.values():
        boxes.sort(key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))


def test_ops_have_white_seams_only_where_they_are_wide_enough_to_tell_apart():
    # at p=16, m=64 seams would paint the busy rows pale, like idle time
    small = artists(plot_timeline(trace_of("zb-v", 2, 4), memory=False))["compute:F"]
    large = artists(plot_timeline(trace_of("zb-v", 16, 64), memory=False))["compute:F"]
    assert small.get_linewidths()[0] > 0 and large.get_linewidths()[0] == 0


def test_dualpipe_at_scale_draws_every_pair():
    trace = trace_of("dualpipe", 16, 64)
    found = artists(plot_timeline(trace, memory=False))
    assert drawn(found["pair"]) == int(trace.overlapped.sum()) > 0


def test_figures_are_written_as_png_and_svg_and_other_names_are_refused(tmp_path):
    trace = trace_of("1f1b", 2, 4)
    plot_timeline(trace, tmp_path / "t.png")
    plot_timeline(trace, tmp_path / "t.svg")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "t.svg").read_text()[:1000]
    with pytest.raises(FigureError, match="png"):
        plot_timeline(trace, tmp_path / "t.bmp")


def test_predicted_vs_measured_draws_both_traces_and_an_error_per_rank():
    graph = validate(build("zb-h1", 4, 8))
    predicted = simulate(graph, COSTS)
    slower = dataclasses.replace(COSTS, stages=(dataclasses.replace(COSTS.stages[0], forward=1.2),))
    measured = dataclasses.replace(simulate(graph, slower), source="measured").shifted(7.0)
    fig = plot_compare(predicted, measured)
    found = artists(fig)
    for i, op in enumerate(OPS):
        n = sum(int(((t.lane == COMPUTE) & (t.op == i)).sum()) for t in (predicted, measured))
        assert sum(drawn(c) for c in fig.axes[0].collections if c.get_gid() == f"compute:{op}") == n
    notes = [t for t in fig.axes[0].texts if t.get_gid() != "label"]
    assert len(notes) == 4 and all("bubble" in t.get_text() for t in notes)
    assert "error +" not in fig._suptitle.get_text()  # predicted faster: predicted - measured < 0
    assert len(found["labels"]) > 0


def test_predicted_vs_measured_refuses_traces_of_different_shapes():
    with pytest.raises(TraceError, match="differ"):
        plot_compare(trace_of("1f1b", 4, 8), trace_of("1f1b", 2, 8))


def test_sweep_chart_has_a_line_per_schedule_and_a_pareto_point_each():
    points = [SweepPoint(s, 4, m, makespan=10.0 * m + k, bubble_ratio=0.1 * k / m, peak_memory=1e9 * (3 - k))
              for k, s in enumerate(("1f1b", "zb-h1", "zb-v")) for m in (4, 8)]
    points.append(SweepPoint("dualpipe", 4, 8, error="needs even p"))
    fig = plot_sweep(points)
    for ax, gid in zip(fig.axes, ("bubble", "memory")):
        assert len([l for l in ax.get_lines() if l.get_gid() == gid]) == 3
    assert len([l for l in fig.axes[2].get_lines() if l.get_gid() == "pareto"]) == 3


# figures/sweep.png's right panel at m = 32 (seconds, GiB): a crowded corner of 8 schedules
CROWDED = {"gpipe": (0.9962, 34.25), "1f1b": (1.1206, 6.25), "interleaved-1f1b": (0.9759, 7.75),
           "looped-bfs": (0.9542, 34.25), "zb-h1": (0.9645, 6.125), "zb-h2": (0.9341, 9.125), "zb-v": (0.9476, 6.25),
           "dualpipe": (0.991, 9.312), "dualpipev": (1.0809, 6.812), "v-half": (1.1532, 5.25), "v-min": (1.5971, 4.188)}


def test_sweep_names_in_the_pareto_panel_overlap_nothing():
    points = [SweepPoint(s, 4, 32, makespan=t, bubble_ratio=0.1, peak_memory=gib * 2**30)
              for s, (t, gib) in CROWDED.items()]
    fig = plot_sweep(points, pareto_m=32)
    fig.canvas = FigureCanvasAgg(fig)
    fig.canvas.draw()  # places the annotations
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[2]
    names = [t for t in ax.texts if t.get_gid() == "name"]
    named = {t.get_text() for t in names}
    front = {p.schedule for p in pareto_front(points)}
    assert front <= named and len(named) >= len(CROWDED) - 2  # the front always; at most two left to the legend
    boxes = [Text.get_window_extent(t, renderer) for t in names]  # the name alone, not its leader line
    frame = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1, names[i].get_text()
        for j, b in enumerate(boxes[:i]):
            assert not a.overlaps(b), (names[i].get_text(), names[j].get_text())
    markers = {line: line.get_window_extent(renderer) for line in ax.get_lines() if line.get_gid() == "pareto"}
    for text, box in zip(names, boxes):
        hit = [m for m in markers.values() if box.overlaps(m)]
        assert not hit, text.get_text()


def test_figures_say_microbatches_not_mb():
    import re

    from pipesched.plots.gallery import plot_gallery

    points = [SweepPoint(s, 4, m, makespan=10.0 * m + k, bubble_ratio=0.1, peak_memory=1e9 * (k + 1))
              for k, s in enumerate(("1f1b", "zb-v")) for m in (4, 8)]
    figures = [plot_timeline(trace_of("zb-v", 2, 4)), plot_gallery([trace_of("1f1b"), trace_of("zb-h1")]),
               plot_sweep(points), plot_compare(trace_of("1f1b", 2, 4), trace_of("1f1b", 2, 4))]
    for fig in figures:
        fig.canvas = FigureCanvasAgg(fig)
        fig.canvas.draw()  # tick labels exist once drawn
        words = " ".join(t.get_text() for t in fig.findobj(Text))
        assert not re.search(r"\bmbs?\b", words, re.IGNORECASE), words


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_a_figure_saved_twice_is_the_same_bytes(tmp_path, suffix):
    # no dates or versions in the files: figures/make_figures.py rewrites only what changed
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    plot_timeline(trace_of("zb-v", 2, 4), first)
    plot_timeline(trace_of("zb-v", 2, 4), second)
    assert first.read_bytes() == second.read_bytes()


def test_pareto_front_keeps_only_points_nothing_beats_on_both_axes():
    pts = [SweepPoint("a", 4, 8, makespan=10, peak_memory=5), SweepPoint("b", 4, 8, makespan=8, peak_memory=6),
           SweepPoint("c", 4, 8, makespan=9, peak_memory=7), SweepPoint("d", 4, 8, makespan=7, peak_memory=9)]
    assert [p.schedule for p in pareto_front(pts)] == ["a", "b", "d"]


def test_arrows_run_from_each_send_start_to_its_receive_end():
    """In a measured trace a receive is posted early and ends late: the line follows it."""
    trace = trace_of("1f1b", 2, 4)
    recv = trace.lane == RECV
    trace.start[recv] -= 0.3
    trace.end[recv] += 0.2
    lines = artists(plot_timeline(trace, arrows=True))["arrows"]
    t0 = trace.start[trace.lane == COMPUTE].min()
    starts = sorted(seg[0][0] for seg in lines.get_segments())
    ends = sorted(seg[1][0] for seg in lines.get_segments())
    assert starts == pytest.approx(sorted(trace.start[trace.lane == SEND] - t0))
    assert ends == pytest.approx(sorted(trace.end[recv] - t0))


def test_sweep_without_memory_shows_makespans_instead_of_a_pareto_front():
    points = [SweepPoint(s, 4, 8, makespan=10.0 + k, bubble_ratio=0.1, peak_memory=0.0)
              for k, s in enumerate(("1f1b", "zb-h1"))]
    fig = plot_sweep(points)
    assert len([p for p in fig.axes[2].patches if p.get_gid() == "makespan"]) == 2
    assert "makespan at m=8" in fig._suptitle.get_text()


def _tick_label_boxes(fig):
    fig.canvas = FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True) if t.get_text()]
    return [t.get_window_extent(renderer) for t in labels]


@pytest.mark.parametrize("p", [2, 8, 16])
def test_row_labels_never_overlap(p):
    fig = plot_timeline(trace_of("zb-v", p, 2 * p), memory=False)
    boxes = sorted(_tick_label_boxes(fig), key=lambda b: b.y0)
    assert len(boxes) >= p
    for lower, upper in zip(boxes, boxes[1:]):
        assert lower.y1 <= upper.y0 + 0.5 or lower.x1 <= upper.x0 or upper.x1 <= lower.x0, (lower, upper)


def test_lane_labels_appear_when_the_figure_is_tall_enough():
    fig = plot_timeline(trace_of("1f1b", 2, 4), memory=False, figsize=(12, 12))
    assert {t.get_text() for t in fig.axes[0].get_yticklabels(minor=True)} == {"send", "recv"}
    assert tuple(fig.get_size_inches()) == (12, 12)


def test_a_window_draws_only_the_spans_inside_it_and_labels_its_real_times():
    trace = trace_of("zb-v", 4, 8)
    fig = plot_timeline(trace, window=(10.0, 14.0))
    found = artists(fig)
    inside = (trace.lane == COMPUTE) & (trace.end >= 10.0) & (trace.start <= 14.0) & ~trace.overlapped
    assert sum(drawn(found[f"compute:{op}"]) for op in OPS if f"compute:{op}" in found) == int(inside.sum())
    ax = fig.axes[0]
    assert ax.get_xlim() == (0, 4.0)
    assert ax.xaxis.get_major_formatter()(0, 0) == "10"


@pytest.mark.parametrize("window,message", [((5.0, 5.0), "START < END"), ((-1.0, 2.0), "START < END"),
                                            ((1e6, 2e6), "no op runs")])
def test_a_bad_window_is_refused(window, message):
    with pytest.raises(FigureError, match=message):
        plot_timeline(trace_of("1f1b", 2, 4), window=window)


@pytest.mark.parametrize("figsize,message", [((2.0, 5.0), "wide"), ((12.0, 2.0), "high")])
def test_a_figure_too_small_for_its_rows_is_refused(figsize, message):
    with pytest.raises(FigureError, match=message):
        plot_timeline(trace_of("1f1b", 8, 8), figsize=figsize)


def test_a_trace_with_too_many_ranks_is_refused_before_drawing():
    from pipesched.plots.timeline import MAX_RANKS_DRAWN
    trace = trace_of("1f1b", 2, 4)
    with pytest.raises(FigureError, match="perfetto"):
        plot_timeline(dataclasses.replace(trace, ranks=MAX_RANKS_DRAWN + 1))


def test_a_compare_figure_takes_a_window_and_a_size():
    fig = plot_compare(trace_of("zb-h1", 4, 8), trace_of("zb-h1", 4, 8, uniform(1.1, 1, 1)), window=(2.0, 6.0),
                       figsize=(9, 6))
    assert tuple(fig.get_size_inches()) == (9, 6) and fig.axes[0].get_xlim() == (0, 4.0)
