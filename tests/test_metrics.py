"""Metrics on hand-made traces with known answers, and the Trace file format."""
import numpy as np
import pytest

from pipesched.simulator.metrics import compute_metrics, covered, merged_intervals
from pipesched.simulator.trace import COMPUTE, RECV, SEND, Span, Trace, TraceError


def test_merged_intervals_and_coverage():
    s, e = merged_intervals(np.array([0.0, 1.0, 5.0, 6.0]), np.array([2.0, 3.0, 6.0, 7.0]))
    assert list(s) == [0.0, 5.0] and list(e) == [3.0, 7.0]  # touching intervals merge too
    cov = covered((s, e), np.array([-1.0, 2.5, 4.0]), np.array([1.0, 5.5, 10.0]))
    assert list(cov) == [1.0, 1.0, 2.0]


def synthetic() -> Trace:
    spans = [
        Span(0, COMPUTE, "F", 0, 0, 0.0, 1.0), Span(0, COMPUTE, "BW", 0, 0, 3.0, 5.0),
        Span(1, COMPUTE, "F", 0, 1, 2.0, 3.0), Span(1, COMPUTE, "BW", 0, 1, 3.0, 4.0),
        # overlapped pair drawn as two spans over the same time: busy counts it once
        Span(1, COMPUTE, "F", 1, 1, 4.0, 4.5, overlapped=True), Span(1, COMPUTE, "BW", 1, 1, 4.0, 4.5, overlapped=True),
        Span(0, SEND, "F", 0, 0, 1.0, 2.0, 1), Span(1, RECV, "F", 0, 0, 1.0, 2.0, 0),
        Span(1, SEND, "BW", 0, 1, 4.0, 4.5, 0), Span(0, RECV, "BW", 0, 1, 4.0, 4.5, 1),
    ]
    memory = [([0.0, 0.0, 5.0], [10.0, 30.0, 10.0]), ([0.0], [7.0])]
    return Trace.from_spans("synthetic", 2, 2, "measured", spans, memory)


def test_metrics_of_a_known_trace():
    m = compute_metrics(synthetic())
    assert m.makespan == 5.0
    assert [r.busy for r in m.per_rank] == [3.0, 2.5]
    assert [r.idle for r in m.per_rank] == [2.0, 2.5]
    assert m.bubble_ratio == pytest.approx(1 - 5.5 / 10)
    assert m.comm_time == pytest.approx(1.5)
    # rank 1 computes during none of [1, 2]; rank 0 computes during all of [4, 4.5]
    assert m.comm_hidden_fraction == pytest.approx(0.5 / 1.5)
    assert [r.peak_memory_bytes for r in m.per_rank] == [30.0, 7.0]


def test_shifted_trace_has_the_same_metrics():
    a, b = compute_metrics(synthetic()), compute_metrics(synthetic().shifted(100.0))
    assert a.makespan == pytest.approx(b.makespan) and a.bubble_ratio == pytest.approx(b.bubble_ratio)


def test_trace_json_round_trip(tmp_path):
    trace = synthetic()
    trace.save(tmp_path / "t.json")
    again = Trace.load(tmp_path / "t.json")
    assert list(again.spans()) == list(trace.spans())
    assert again.source == "measured"


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format="x"), "trace format is 'x'"),
    (lambda d: d["spans"].append([5, "compute", "F", 0, 0, 0.0, 1.0, -1, False]), "rank 5, outside 0..1"),
    (lambda d: d["spans"].append([0, "compute", "F", 0, 0, 2.0, 1.0, -1, False]), "end >= start"),
    (lambda d: d["spans"].append([0, "disk", "F", 0, 0, 0.0, 1.0, -1, False]), "lane 'disk'"),
    (lambda d: d.pop("memory"), "lacks 'memory'"),
])
def test_malformed_traces(edit, message):
    doc = synthetic().to_dict()
    edit(doc)
    with pytest.raises(TraceError, match=message):
        Trace.from_dict(doc)
