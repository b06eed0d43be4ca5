"""Bad input of every kind, through the command line: one line on stderr, exit status 2,
nothing written, never a traceback or a hang. One case per way a file or flag can be
wrong, so a regression names the exact input."""
import json
import os
import subprocess
import sys
import time

import pytest

from pipesched.cli import main
from pipesched.schedules import fileformat
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import MAX_OPS, build
from pipesched.simulator.costs import uniform
from pipesched.simulator.trace import Trace, TraceError

from helpers import makespan


def refused(capsys, argv, message):
    assert main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and message in err and "internal error" not in err, err


GOOD = fileformat.to_dict(build("1f1b", 2, 2))


def edited(**changes):
    doc = json.loads(json.dumps(GOOD))
    for key, fn in changes.items():
        doc[key] = fn(doc[key]) if callable(fn) else fn
    return json.dumps(doc)


def swap_first_two(programs):
    programs[1][0], programs[1][1] = programs[1][1], programs[1][0]
    return programs


SCHEDULE_FILES = {
    "empty": ("", "not valid JSON"),
    "not JSON": ("{", "not valid JSON"),
    "not UTF-8": (b"\xff\xfe\x00", "not UTF-8"),
    "nested too deeply": ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    "a list": ("[1, 2]", "must hold a JSON object"),
    "no programs": (json.dumps({k: v for k, v in GOOD.items() if k != "programs"}), "lacks 'programs'"),
    "unknown field": (edited(extra=1), "unknown field 'extra'"),
    "ranks a string": (edited(ranks="2"), "ranks must be an integer"),
    "ranks a float": (edited(ranks=2.0), "ranks must be an integer"),
    "ranks negative": (edited(ranks=-1), "ranks must be an integer >= 1"),
    "ranks huge": (edited(ranks=10**12), "one program per rank"),
    "microbatches NaN": (edited(microbatches=2).replace('"microbatches": 2', '"microbatches": NaN'),
                         "microbatches must be an integer"),
    # without microbatch_paths the default list would take 8 GB: refused from the op count
    "microbatches huge": (json.dumps({**{k: v for k, v in GOOD.items() if k != "microbatch_paths"},
                                      "microbatches": 10**9}), "programs hold only 8 ops"),
    "op on a wrong rank": (edited(programs=lambda p: [p[0] + [p[1].pop(0)], p[1]]), "is placed on rank 1"),
    "duplicate op": (edited(programs=lambda p: [p[0] + [p[0][0]], p[1]]), "appears more than once"),
    "cycle": (edited(programs=swap_first_two), "deadlocks: rank 1: BW0@1 -> rank 1: F0@1"),
    "unknown op": (edited(programs=lambda p: [[{**p[0][0], "op": "X"}] + p[0][1:], p[1]]), "unknown op 'X'"),
    "negative microbatch": (edited(programs=lambda p: [[{**p[0][0], "mb": -1}] + p[0][1:], p[1]]),
                            "microbatch outside 0..1"),
    "stage a string": (edited(programs=lambda p: [[{**p[0][0], "stage": "0"}] + p[0][1:], p[1]]),
                       "stage must be an integer"),
    "group of three": (edited(programs=lambda p: [[p[0][:3]] + p[0][3:], p[1]]), "group of 3 ops"),
    "missing backward": (edited(programs=lambda p: [p[0][:-1], p[1]]), "has no BW, or B and W"),
    "path out of order": (edited(paths=[[1, 0]]), "must run model stages 0..1 in order"),
    "model stage huge": (edited(stages=lambda s: [{"rank": 0, "model_stage": 10**12}, s[1]]),
                         "running model stage 1000000000000"),
}


@pytest.mark.parametrize("case", sorted(SCHEDULE_FILES))
def test_a_bad_schedule_file_is_refused_in_one_line(tmp_path, capsys, case):
    content, message = SCHEDULE_FILES[case]
    path = tmp_path / "s.json"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    refused(capsys, ["show", path], message)
    refused(capsys, ["simulate", path, "--plot", tmp_path / "t.png"], message)
    assert not (tmp_path / "t.png").exists()


def test_flags_that_contradict_a_schedule_file_are_refused(tmp_path, capsys):
    path = tmp_path / "s.json"
    fileformat.save(build("1f1b", 2, 2), path)
    refused(capsys, ["simulate", path, "-p", 3], "has 2 for -p, but -p 3 was given")
    refused(capsys, ["show", path, "-v", 2], "-v does not apply to a schedule file")
    assert main(["show", str(path), "-p", "2", "-m", "2"]) == 0


def test_a_directory_or_undecodable_csv_is_refused_as_a_schedule(tmp_path, capsys):
    refused(capsys, ["show", tmp_path], "is a directory")
    (tmp_path / "d.json").mkdir()
    refused(capsys, ["simulate", tmp_path / "d.json"], "is a directory")
    (tmp_path / "t.csv").write_bytes(b"\xff\xfe")
    refused(capsys, ["show", tmp_path / "t.csv"], "not UTF-8")


def test_a_built_in_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "1f1b").mkdir()  # e.g. what `validate 1f1b --out 1f1b` left behind
    monkeypatch.chdir(tmp_path)
    assert main(["show", "1f1b", "-p", "2", "-m", "2"]) == 0
    refused(capsys, ["show", "./1f1b"], "is a directory")


COST_FILES = {
    "c.json": ('{"stage": {"forward": NaN}}', "stage.forward must be finite"),
    "c.toml": ('[stage]\nforward = -1\n', "stage.forward must be finite and >= 0"),
    "bw.toml": ('[network]\nbandwidth = 0\n', "bandwidth must be > 0"),
    "str.toml": ('[stage]\nforward = "fast"\n', "stage.forward: expected a time such as 12ms"),
    "unit.toml": ('[stage]\nactivation_memory = "12ms"\n', "stage.activation_memory: unknown size unit 'ms'"),
    "rate.json": ('{"network": {"bandwidth": "50GB"}}', "network.bandwidth: a bandwidth needs a per-second unit"),
    "unknown.json": ('{"stage": {"fwd": 1}}', "unknown field 'fwd'"),
    "bad.toml": ("forward = = 1", "not valid TOML"),
    "binary.toml": (b"\xff\xfe", "not UTF-8"),
    "binary.json": (b"\xff\xfe", "not UTF-8"),
    "deep.json": ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    "denormal.json": ('{"host": {"capacity": 1e-309}}', "must be at least 1e-06 cores"),
    "gpu.json": ('{"host": {"capacity": 1, "gpu": "yes"}}', "host.gpu must be true or false"),
    "pinned_gpu.json": ('{"host": {"capacity": 1, "gpu": true, "pinned": true}}', "a shared GPU (host.gpu) is not pinned"),
    "zero.json": ('{"stage": {"forward": 0, "backward_input": 0, "backward_weight": 0}}', "every op takes 0 s"),
    # each value is finite, their sum is not
    "overflow.json": ('{"stage": {"forward": 1e308, "backward_input": 1e308}}', "overflow to infinity"),
    "slow.json": ('{"stage": {"activation_bytes": 1e308}, "network": {"bandwidth": 1e-308}}', "overflow"),
}


@pytest.mark.parametrize("name", sorted(COST_FILES))
def test_a_bad_cost_file_is_refused_in_one_line(tmp_path, capsys, name):
    content, message = COST_FILES[name]
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    refused(capsys, ["simulate", "1f1b", "-p", 2, "-m", 4, "--costs", path], message)
    refused(capsys, ["sweep", "-p", 2, "--microbatches", "4", "--schedules", "1f1b", "--costs", path,
                     "--csv", tmp_path / "s.csv"], message)
    assert not (tmp_path / "s.csv").exists()


SIM = ["simulate", "1f1b", "-p", "2", "-m", "4"]


@pytest.mark.parametrize("args,message", [
    (["simulate", "1f1b", "-p", "0", "-m", "4"], "needs ranks >= 1, got 0"),
    (["simulate", "1f1b", "-p", "2", "-m", "-1"], "needs microbatches >= 1, got -1"),
    (["simulate", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "0"], "needs v >= 1, got 0"),
    (["simulate", "1f1b", "-p", "1000000000", "-m", "1"], f"more than the {MAX_OPS:,}"),
    (["simulate", "interleaved-1f1b", "-p", "4", "-m", "4", "-v", "100000000"], "ops, more than"),
    ([*SIM, "--runs", "0"], "--runs must be between 1 and"),
    ([*SIM, "--cv", "-1", "--runs", "2"], "--cv must be a finite number >= 0"),
    ([*SIM, "--cv", "0.2"], "--cv only applies to the stochastic mode"),
    ([*SIM, "--seed", "3"], "--seed only applies to the stochastic mode"),
    ([*SIM, "--runs", "100001"], "--runs must be between 1 and 100,000"),
    (["simulate", "1f1b", "-p", "64", "-m", "512", "--runs", "100000"], "op simulations"),
    (["sweep", "-p", "2", "--microbatches", "4", "--pareto-m", "4"], "--pareto-m chooses the chart"),
    ([*SIM, "--cv", "nan", "--runs", "2"], "--cv must be a finite number >= 0"),
    ([*SIM, "--cv", "inf", "--runs", "2"], "--cv must be a finite number >= 0"),
    ([*SIM, "--cv", "1e300", "--runs", "2"], "overflow to infinity"),
    ([*SIM, "--runs", "2", "--seed", "-1"], "--seed must be >= 0"),
    ([*SIM, "--f", "0", "--b", "0", "--w", "0"], "every op takes 0 s"),
    ([*SIM, "--f", "nan"], "forward must be finite"),
    ([*SIM, "--latency", "inf"], "latency must be finite"),
    ([*SIM, "--overlap", "2"], "overlap must be between 0"),
    ([*SIM, "--shared-compute", "1e-309"], "must be at least 1e-06 cores"),
    ([*SIM, "--shared-compute", "nan"], "host.capacity must be a finite number"),
    ([*SIM, "--plot", "/nonexistent/x.png"], "there is no folder '/nonexistent'"),
    ([*SIM, "--plot", "x.bmp"], "must end in .png, .svg, .pdf"),
    ([*SIM, "--trace", "/nonexistent/x.json"], "there is no folder"),
    ([*SIM, "--perfetto", "/nonexistent/x.json"], "there is no folder"),
    ([*SIM, "--trace", "."], "it is a directory"),
    (["sweep", "-p", "0", "--microbatches", "4"], "-p must be >= 1"),
    (["sweep", "-p", "2", "--microbatches", "a,b"], "--microbatches needs comma-separated integers"),
    (["sweep", "-p", "2", "--microbatches", "4,,8"], "--microbatches needs comma-separated integers"),
    (["sweep", "-p", "2", "--microbatches", "4", "-v", "0"], "-v must be >= 1, got 0"),
    (["sweep", "-p", "2", "--microbatches", "4", "--csv", "/nonexistent/s.csv"], "there is no folder"),
    (["sweep", "-p", "2", "--microbatches", "99999999999", "--schedules", "1f1b"], "ops, more than"),
    (["sweep", "-p", "2", "--microbatches", "4", "--engine", "exact", "--shared-compute", "1"],
     "cannot model ranks sharing compute"),
])
def test_a_bad_flag_is_refused_in_one_line(capsys, args, message):
    refused(capsys, args, message)


@pytest.fixture(scope="module")
def trace_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.json"
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--activation-bytes", "1e6", "--bandwidth", "1e9",
                 "--trace", str(path)]) == 0
    return json.loads(path.read_text())


def first_span(**fields):
    def edit(spans):
        columns = ("rank", "lane", "op", "mb", "stage", "start", "end", "peer", "overlapped")
        spans[0] = [fields.get(c, v) for c, v in zip(columns, spans[0])]
        return spans
    return edit


def transfers(peer):
    return lambda spans: [s[:7] + [peer, s[8]] if s[1] != "compute" else s for s in spans]


TRACES = {
    "a list": (lambda d: [], "must be a JSON object"),
    "no spans": (lambda d: {k: v for k, v in d.items() if k != "spans"}, "lacks 'spans'"),
    "spans an object": (lambda d: {**d, "spans": {}}, "spans must be a list"),
    "a short span": (lambda d: {**d, "spans": [[0, "compute"]]}, "list of the 9 columns"),
    "ranks a string": (lambda d: {**d, "ranks": "2"}, "ranks must be an integer >= 1"),
    "ranks fractional": (lambda d: {**d, "ranks": 2.7}, "ranks must be an integer >= 1"),
    "microbatches negative": (lambda d: {**d, "microbatches": -1}, "microbatches must be an integer >= 1"),
    "rank fractional": (lambda d: {**d, "spans": first_span(rank=0.5)(d["spans"])}, "rank 0.5"),
    "unknown lane": (lambda d: {**d, "spans": first_span(lane="gpu")(d["spans"])}, "lane 'gpu'"),
    "microbatch huge": (lambda d: {**d, "spans": first_span(mb=10**15)(d["spans"])}, "outside 0..1"),
    "end infinite": (lambda d: {**d, "spans": first_span(end=float("inf"))(d["spans"])}, "times must be finite"),
    "start NaN": (lambda d: {**d, "spans": first_span(start=float("nan"))(d["spans"])}, "times must be finite"),
    "end before start": (lambda d: {**d, "spans": first_span(end=-1.0)(d["spans"])}, "end >= start"),
    "overlapped a string": (lambda d: {**d, "spans": first_span(overlapped="yes")(d["spans"])}, "overlapped 'yes'"),
    "compute with a peer": (lambda d: {**d, "spans": first_span(peer=1)(d["spans"])}, "-1 for compute"),
    "transfer to nowhere": (lambda d: {**d, "spans": transfers(99)(d["spans"])}, "another rank in 0..1"),
    "memory sample NaN": (lambda d: {**d, "memory": [[[float("nan"), 0.0]], []]}, "[seconds, bytes]"),
    "memory of one rank": (lambda d: {**d, "memory": [[]]}, "memory for 1 ranks, expected 2"),
    "source a number": (lambda d: {**d, "source": 5}, "source must be a string"),
    "meta a list": (lambda d: {**d, "meta": [1]}, "meta must be an object"),
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_a_bad_trace_is_refused_in_one_line(tmp_path, capsys, trace_doc, case):
    edit, message = TRACES[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(edit(json.loads(json.dumps(trace_doc)))))
    with pytest.raises(TraceError, match=None):
        Trace.load(path)
    refused(capsys, ["plot", path, "-o", tmp_path / "x.png"], message)
    assert not (tmp_path / "x.png").exists()


def test_unreadable_traces_and_outputs_are_refused_in_one_line(tmp_path, capsys, trace_doc):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(trace_doc))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(capsys, ["plot", tmp_path / "bin.json", "-o", tmp_path / "x.png"], "not valid JSON")
    refused(capsys, ["plot", tmp_path / "deep.json", "-o", tmp_path / "x.png"], "nests too deeply")
    refused(capsys, ["plot", tmp_path, "-o", tmp_path / "x.png"], "Is a directory")
    refused(capsys, ["plot", good, "--perfetto", tmp_path], "it is a directory")
    refused(capsys, ["plot", good, "-o", "/nonexistent/x.png"], "there is no folder")


def test_the_saved_trace_round_trips_through_the_stricter_reader(trace_doc):
    trace = Trace.from_dict(trace_doc)
    assert Trace.from_dict(trace.to_dict()).to_dict() == trace.to_dict() == trace_doc


def test_the_op_limit_is_checked_before_building():
    with pytest.raises(ScheduleError, match="ops, more than"):
        build("zb-v", 1000, 10_000)
    build("interleaved-1f1b", 4, 8, 2)  # ordinary sizes are untouched


@pytest.mark.parametrize("name", ["zb-h2", "zb-v"])
@pytest.mark.parametrize("f,b,w", [(0, 1, 1), (1, 1, 0), (1, 0, 1), (0, 0, 1)])
def test_cost_adaptive_builders_accept_zero_op_times(name, f, b, w):
    # a zero-length op used to be refused with a message about "building" that named no flag
    costs = uniform(f, b, w)
    p, m = 4, 8
    assert makespan(build(name, p, m, op_time=costs.op_time_for(p)), costs) >= m * (f + b + w) - 1e-9


# --- bounds checked in the time it takes to read the input ----------------------------

PLAN = ["plan", "-p", "4", "-m", "8", "--f", "1ms"]


@pytest.mark.parametrize("args", [
    [*PLAN, "--memory-limit", "1e308", "--activation-memory", "1GiB"],
    [*PLAN, "--memory-limit", "9e307", "--activation-memory", "1GiB"],
    [*PLAN, "--memory-limit", "1.7e308", "--activation-memory", "1GiB"],
    [*PLAN, "--memory-limit", "8GiB", "--activation-memory", "1e-300"],
    ["simulate", "zb-auto", "-p", "4", "-m", "8", "--memory-limit", "1e308", "--activation-memory", "1GiB"],
])
def test_byte_limits_beyond_any_activation_count_do_not_overflow(capsys, args):
    # the activations a byte limit leaves room for overflowed int(): an internal error
    assert main(args) == 0, capsys.readouterr().err
    assert "internal error" not in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["plan", "-p", "100000"], "-m (default 2p): 200,000 microbatches is more than the 33"),
    (["plan", "-p", "3", "--schedules", "dualpipe"], "no schedule could be built for p=3: dualpipe needs an even"),
    (["plan", "-p", "4", "--global-batch", "10000000000", "--microbatch-size", "1"],
     "--global-batch / --microbatch-size: 10,000,000,000 microbatches is more than the 833,333"),
    (["plan", "-p", "4", "-m", "1..99999999999999999999"], "microbatches is more than the 833,333"),
    (["plan", "-p", "4", "-m", "4,99999999999999999999"], "microbatches is more than the 833,333"),
    (["plan", "-p", "99999999999"], "ranks a schedule within the 10,000,000 op limit"),
    (["plan", "-p", "4", "-m", "1..800000"], "more than the 10,000,000 a plan takes"),
    (["plan", "-p", "4", "-m", "8", "--schedules", "dualpipe", "-v", "2"], "no candidate to build"),
])
def test_plan_names_why_nothing_could_be_planned(capsys, args, message):
    # it said "no schedule fits the memory budget (no limit)", or searched for minutes
    t0 = time.monotonic()
    refused(capsys, args, message)
    assert time.monotonic() - t0 < 5


def test_plan_json_is_strict_json_for_degenerate_costs(capsys):
    assert main(["plan", "-p", "2", "-m", "4", "--f", "0", "--b", "0", "--w", "1e-320", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert doc["best"]["throughput"] is None  # infinite: written as null


LAYERS = '{"layers": {"layer": {"forward": 1, "activation_memory": MEM}, "count": COUNT}}'
LAYER_FILES = {
    "count_1e18.json": (LAYERS.replace("MEM", "1").replace("COUNT", str(10 ** 18)),
                        "layers.count is 1000000000000000000; a model has at most 100,000 layers"),
    "count_1e9.json": ('{"layers": {"layer": {"forward": 1}, "count": 1000000000}}',  # 58 bytes
                       "layers.count is 1000000000; a model has at most 100,000 layers"),
    "count_digits.json": (LAYERS.replace("MEM", "1").replace("COUNT", "9" * 4000),
                          "layers.count is an integer of 4000 digits"),
    "count_1e29.toml": ("[layers]\ncount = 100000000000000000000000000000\n[layers.layer]\nforward = 1\n",
                        "a model has at most 100,000 layers"),
    "memory_1e308.json": (LAYERS.replace("MEM", "1e308").replace("COUNT", "8"), "overflow to infinity"),
    "times_1e308.json": ('{"layers": {"layer": {"forward": 1e308}, "count": 8}}',
                         "the layers' times add up to more than the largest float"),
    "stages_1e308.json": ('{"model_stages": [' + ", ".join(['{"forward": 1, "backward_input": 1e308}'] * 4) + "]}",
                          "overflow to infinity"),
}


@pytest.mark.parametrize("name", sorted(LAYER_FILES))
def test_a_cost_file_s_layers_are_bounded_before_use(tmp_path, capsys, name):
    content, message = LAYER_FILES[name]
    path = tmp_path / name
    path.write_text(content)
    t0 = time.monotonic()
    for p in (2, 8):  # 8 ranks merge the four model stages two by two
        refused(capsys, ["simulate", "1f1b", "-p", p, "-m", 8, "--costs", path], message)
    assert time.monotonic() - t0 < 5


def test_the_documented_layer_limit_is_split_balanced_in_seconds(tmp_path):
    # 100,000 layers, balanced: the O(S n^2) programme ran for minutes
    path = tmp_path / "c.json"
    path.write_text('{"layers": {"layer": {"forward": "1ms", "backward_input": "1ms", "backward_weight": "1ms"}, '
                    '"count": 100000, "embedding": {"forward": "40ms"}}}')
    proc = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "1f1b", "-p", "4", "-m", "4", "--costs",
                           str(path), "--partition", "balanced", "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["makespan"] > 0


@pytest.mark.parametrize("figsize,message", [
    ("1000,1000", "a side must be more than 0 and at most 100 inches"),
    ("200,200", "at most 100 inches"),
    ("100000,100000", "at most 100 inches"),
    ("60,60", "more than the 67,108,864 drawn"),
    ("0,5", "more than 0"),
])
def test_figure_sizes_are_bounded(capsys, tmp_path, figsize, message):
    # 1000,1000 was a MemoryError, 100000,100000 a ValueError, 200,200 took 3.6 GB
    refused(capsys, ["simulate", "1f1b", "-p", 2, "-m", 4, "--plot", tmp_path / "t.png", "--figsize", figsize],
            message)
    assert not (tmp_path / "t.png").exists()


def test_numpy_and_matplotlib_warnings_do_not_reach_stderr(tmp_path):
    # a window out to 1e308 s overflowed matplotlib's tick locator: a RuntimeWarning on stderr
    proc = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "1f1b", "-p", "2", "-m", "4", "--plot",
                           str(tmp_path / "w.png"), "--window", "0,1e308"], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
