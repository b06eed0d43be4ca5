"""Quantities with units on the command line and in cost files."""
import json

import pytest

from pipesched.cli import main
from pipesched.simulator.cost_file import from_dict
from pipesched.simulator.units import UnitError, parse_bandwidth, parse_bytes, parse_seconds


@pytest.mark.parametrize("text,seconds", [("12ms", 0.012), ("1.5us", 1.5e-6), ("0.2", 0.2), (3, 3.0),
                                          ("2 s", 2.0), ("40ns", 4e-8), ("1e-3s", 1e-3)])
def test_times_read_in_seconds(text, seconds):
    assert parse_seconds(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text,nbytes", [("128MiB", 128 * 2 ** 20), ("40GiB", 40 * 2 ** 30), ("1.5GB", 1.5e9),
                                         ("4096", 4096), ("2kB", 2000), ("1 KiB", 1024)])
def test_sizes_read_in_bytes(text, nbytes):
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text,rate", [("50GB/s", 5e10), ("25GiB/s", 25 * 2 ** 30), ("400Gbit/s", 5e10), ("1e10", 1e10)])
def test_bandwidths_read_in_bytes_per_second(text, rate):
    assert parse_bandwidth(text) == rate


@pytest.mark.parametrize("parse,text,message", [
    (parse_seconds, "12 parsecs", "unknown time unit 'parsecs'"),
    (parse_seconds, "fast", "expected a time"),
    (parse_bytes, "12ms", "unknown size unit 'ms'"),
    (parse_bandwidth, "50GB", "needs a per-second unit"),
    (parse_bandwidth, "50GHz/s", "unknown bandwidth unit"),
])
def test_bad_units_say_what_was_expected(parse, text, message):
    with pytest.raises(UnitError, match=message):
        parse(text)


def simulate_json(capsys, *args):
    assert main(["simulate", "zb-h2", "-p", "4", "-m", "8", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_flags_with_units_predict_what_plain_numbers_do(capsys):
    with_units = simulate_json(capsys, "--f", "12ms", "--b", "14ms", "--w", "10ms", "--activation-bytes", "128MiB",
                               "--bandwidth", "50GB/s", "--activation-memory", "1GiB", "--latency", "5us")
    plain = simulate_json(capsys, "--f", "0.012", "--b", "0.014", "--w", "0.010", "--activation-bytes",
                          str(128 * 2 ** 20), "--bandwidth", "5e10", "--activation-memory", str(2 ** 30),
                          "--latency", "5e-6")
    assert with_units["makespan"] == plain["makespan"] > 0
    assert with_units["per_rank"] == plain["per_rank"]


def test_a_cost_file_written_by_hand_takes_units():
    by_hand = from_dict({"stage": {"forward": "12ms", "backward_input": "14ms", "backward_weight": "10ms",
                                   "activation_memory": "128MiB"},
                         "network": {"latency": "2us", "bandwidth": "50GB/s"}, "op_overhead": "1us",
                         "host_overhead": {"per_op": "3us"}})
    stage = by_hand.stages[0]
    assert (stage.forward, stage.backward_input, stage.backward_weight) == (0.012, 0.014, 0.010)
    assert stage.activation_memory == 128 * 2 ** 20
    assert by_hand.network.intra.bandwidth == 5e10 and by_hand.network.intra.latency == pytest.approx(2e-6)
    assert by_hand.op_overhead == pytest.approx(1e-6) and by_hand.host_overhead.per_op == pytest.approx(3e-6)


@pytest.mark.parametrize("args,message", [
    (["--f", "12parsec"], "argument --f: unknown time unit 'parsec'"),
    (["--activation-bytes", "12ms"], "argument --activation-bytes: unknown size unit 'ms'"),
    (["--bandwidth", "50GB"], "argument --bandwidth: a bandwidth needs a per-second unit"),
    (["--memory-limit=-1GiB"], "--memory-limit must be a size > 0"),
    (["--max-activations", "0.5"], "--max-activations must be a number >= 1"),
])
def test_a_bad_quantity_is_one_line_and_exit_2(capsys, args, message):
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
