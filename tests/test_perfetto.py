"""The Perfetto / Chrome trace export: required fields, microseconds, matched flows."""
import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import Link, Network, uniform
from pipesched.simulator.perfetto import save_chrome_trace, to_chrome_trace
from pipesched.simulator.trace import COMPUTE, RECV, SEND

COSTS = dict(activation_bytes=1e6, activation_memory=1e9, param_bytes=2e9, network=Network(Link(0.05, 1e7)))


def trace_of(name, p=4, m=8, **costs):
    return simulate(validate(build(name, p, m)), uniform(1, 1, 1, **{**COSTS, **costs}))


def events(doc, ph):
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


@pytest.mark.parametrize("name,contention", [("dualpipe", True), ("zb-v", False), ("interleaved-1f1b", True)])
def test_required_fields_processes_threads_and_microseconds(name, contention):
    trace = trace_of(name, contention=contention)
    doc = json.loads(json.dumps(to_chrome_trace(trace)))  # plain JSON all the way down
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(e), e
    procs = {e["pid"]: e["args"]["name"] for e in events(doc, "M") if e["name"] == "process_name"}
    assert procs == {r: f"rank {r}" for r in range(trace.ranks)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events(doc, "M") if e["name"] == "thread_name"}
    slices = events(doc, "X")
    assert len(slices) == len(trace)
    by_lane = Counter()
    for e in slices:
        thread = threads[e["pid"], e["tid"]]
        lane = COMPUTE if thread.startswith("compute") else SEND if thread.startswith("send") else RECV
        by_lane[lane] += 1
        assert e["dur"] >= 0 and e["ts"] >= 0
    assert by_lane == Counter(trace.lane.tolist())
    # real durations in microseconds: 1 s ops (halved on 2p model stages) and 0.15 s transfers
    comp = sorted({round(e["dur"]) for e in slices if e["cat"] in ("F", "B", "W", "BW")})
    expected = sorted({round((b - a) * 1e6) for a, b, l in zip(trace.start, trace.end, trace.lane) if l == COMPUTE})
    assert comp == expected and max(comp) >= 5e5
    assert {round(e["dur"]) for e in slices if e["cat"] == "transfer"} == {150_000}


@pytest.mark.parametrize("contention", [True, False])
def test_every_send_has_one_flow_to_its_receive(contention):
    trace = trace_of("dualpipe", contention=contention)
    doc = to_chrome_trace(trace)
    slices = {(e["pid"], e["tid"], e["ts"], e["cat"]): e for e in events(doc, "X")}
    starts, ends = events(doc, "s"), events(doc, "f")
    assert len(starts) == len(ends) == int((trace.lane == SEND).sum())
    assert Counter(e["id"] for e in starts) == Counter(e["id"] for e in ends)
    assert max(Counter(e["id"] for e in starts).values()) == 1
    start_of = {e["id"]: e for e in starts}
    for f in ends:
        s = start_of[f["id"]]
        assert f["bp"] == "e" and s["cat"] == f["cat"] == "transfer"
        # each end binds to a slice at the same pid, tid, ts and category (as viewers match them)
        send, recv = slices[s["pid"], s["tid"], s["ts"], s["cat"]], slices[f["pid"], f["tid"], f["ts"], f["cat"]]
        assert send["args"]["peer"] == f["pid"] and recv["args"]["peer"] == s["pid"]
        assert (send["args"]["op"], send["args"]["microbatch"], send["args"]["stage"]) == \
            (recv["args"]["op"], recv["args"]["microbatch"], recv["args"]["stage"])


@pytest.mark.parametrize("contention", [True, False])
def test_slices_on_a_thread_never_partly_overlap(contention):
    """Both viewers need each thread's slices nested or disjoint."""
    doc = to_chrome_trace(trace_of("dualpipe", contention=contention))
    per_thread = defaultdict(list)
    for e in events(doc, "X"):
        per_thread[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_thread.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-6 or b1 <= a1 + 1e-6


def test_memory_is_a_counter_track_per_rank():
    trace = trace_of("1f1b")
    doc = to_chrome_trace(trace)
    counters = events(doc, "C")
    for r, (times, nbytes) in enumerate(trace.memory):
        mine = [e for e in counters if e["pid"] == r]
        assert [e["ts"] for e in mine] == pytest.approx([t * 1e6 for t in times])
        assert [e["args"]["bytes"] for e in mine] == list(nbytes)


def test_negative_times_are_shifted_and_the_file_is_json(tmp_path):
    trace = trace_of("1f1b", 2, 4).shifted(-5.0)
    save_chrome_trace(trace, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["otherData"]["offset_s"] == pytest.approx(5.0)
    assert min(e["ts"] for e in doc["traceEvents"] if "ts" in e) == pytest.approx(0.0)


def test_the_export_needs_neither_matplotlib_nor_torch():
    code = ("import sys, simulator.perfetto; "
            "assert not {'matplotlib', 'torch'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
