"""Planning a cluster directly: `simulate`, `sweep` and `plan` with the model and hardware
options of `costs` (pipesched/commands/model_options.py) give what the cost file `costs
-o` writes gives; clashes and missing options are one line and exit status 2; `plan
--microbatch-size 1,2` searches an estimate per size."""
from __future__ import annotations

import json

import pytest

from pipesched.cli import main

MODEL = ["--model-preset", "llama3-8b", "--gpu", "h100-sxm", "--tp", "4", "--sp", "--seq", "4096", "--dp", "2",
         "--zero", "1"]
# the part of MODEL the cost file carries (--dp stays: it also sets the simulated step's all-reduce)
DP = ["--dp", "2"]
SMALL_PLAN = ["-p", "4", "-m", "8", "--schedules", "1f1b,zb-h1,zb-v,zb-auto", "--memory-limit", "10GiB"]


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cost_file(tmp_path, capsys):
    path = tmp_path / "c.json"
    code, _, err = cli(capsys, "costs", *MODEL, "-o", path)
    assert code == 0, err
    return path


def test_simulate_with_the_model_options_is_simulate_with_the_cost_file(capsys, cost_file):
    code, direct, err = cli(capsys, "simulate", "zb-v", "-p", "4", "-m", "8", *MODEL, "--json")
    assert code == 0, err
    code, via_file, err = cli(capsys, "simulate", "zb-v", "-p", "4", "-m", "8", "--costs", cost_file, *DP, "--json")
    assert code == 0, err
    direct, via_file = json.loads(direct), json.loads(via_file)
    assert direct["makespan"] == via_file["makespan"] > 0
    peaks = [[r["peak_memory_bytes"] for r in d["per_rank"]] for d in (direct, via_file)]
    assert peaks[0] == peaks[1]
    assert direct["layers"] == via_file["layers"]


def test_plan_with_the_model_options_is_plan_with_the_cost_file(capsys, cost_file):
    code, direct, err = cli(capsys, "plan", *SMALL_PLAN, *MODEL, "--json")
    assert code == 0, err
    code, via_file, err = cli(capsys, "plan", *SMALL_PLAN, "--costs", cost_file, *DP, "--json")
    assert code == 0, err
    direct, via_file = json.loads(direct), json.loads(via_file)
    assert direct["best"] == via_file["best"]
    assert direct["candidates"] == via_file["candidates"]
    assert any(not c["fits"] for c in direct["candidates"])  # the limit binds: the budget is compared in bytes


def test_sweep_with_the_model_options_is_sweep_with_the_cost_file(capsys, cost_file):
    args = ["-p", "4,8", "-m", "16", "--schedules", "1f1b,zb-h1"]
    code, direct, err = cli(capsys, "sweep", *args, *MODEL)
    assert code == 0, err
    code, via_file, err = cli(capsys, "sweep", *args, "--costs", cost_file, *DP)
    assert code == 0, err
    assert direct == via_file and "GiB" in direct


def test_plan_searches_a_list_of_microbatch_sizes_in_one_command(capsys):
    args = ["plan", "-p", "4", "--global-batch", "16", "--schedules", "1f1b,zb-h1", "--memory-limit", "80GB",
            "--recompute", "off", *MODEL]
    code, out, err = cli(capsys, *args, "--microbatch-size", "1,2", "--json")
    assert code == 0, err
    both = json.loads(out)["candidates"]
    assert {(c["microbatch_size"], c["microbatches"]) for c in both} == {(1, 16), (2, 8)}
    for size in (1, 2):  # each size's candidates are what planning that size alone finds
        code, out, err = cli(capsys, *args, "--microbatch-size", size, "--json")
        assert code == 0, err
        alone = json.loads(out)["candidates"]
        mine = [c for c in both if c["microbatch_size"] == size]
        assert [c["makespan"] for c in mine] == [c["makespan"] for c in alone]
        assert [c["peak_memory"] for c in mine] == [c["peak_memory"] for c in alone]
        # ranked in samples per second: a size-2 microbatch counts two sequences
        assert all(c["throughput"] == pytest.approx(size * c["microbatches"] / c["makespan"]) for c in mine)
    # a microbatch of 2 costs more than one of 1 but less than two of them (fixed costs per op)
    by = {(c["schedule"], c["microbatch_size"]): c for c in both}
    assert by["1f1b", 2]["peak_memory"] > by["1f1b", 1]["peak_memory"]
    code, out, err = cli(capsys, *args, "--microbatch-size", "1,2")
    assert code == 0, err
    assert "samples/s" in out and " b " in out.splitlines()[1] and "microbatches of " in out


def test_plan_without_a_limit_plans_for_the_gpu_memory(capsys):
    code, out, err = cli(capsys, "plan", "-p", "4", "-m", "8", "--schedules", "1f1b", *MODEL)
    assert code == 0, err
    assert "planning for the GPU's memory, 79.65 GiB" in err and "budget 79.65 GiB" in out


@pytest.mark.parametrize("argv,words", [
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--costs", "c.json", *MODEL], "not both"),
    (["plan", "-p", "4", "--model-preset", "llama3-8b", "--seq", "4096"], "--gpu KIND"),
    (["sweep", "-p", "4", "-m", "8", "--model-preset", "llama3-8b", "--gpu", "h100-sxm"], "--seq N"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--tp", "8"], "--tp describes a model"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--gpu", "h100-sxm"], "--gpu describes a model"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--f", "1ms", *MODEL], "--f does not apply"),
    (["plan", "-p", "4", "--microbatch-size", "1,2", "--f", "1"], "a list needs a model"),
    (["plan", "-p", "4", "--microbatch-size", "1,x", *MODEL], "--microbatch-size needs"),
    (["plan", "-p", "4", "--recompute", "on", "--layer-recompute", "full", *MODEL], "give one of them"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--recompute", "--layer-recompute", "selective", *MODEL],
     "give one of them"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", *MODEL[:-4], "--tp", "3"], "does not divide"),
    (["plan", "-p", "4", "--model-preset", "llama9", "--gpu", "h100-sxm", "--seq", "1"], "unknown model preset"),
    (["sweep", "-p", "4", "-m", "8", "--model-preset", "llama3-8b", "--gpu", "b200", "--seq", "1"], "unknown GPU"),
    (["costs", "--model-preset", "llama3-8b", "--seq", "4096"], "give --gpu"),
])
def test_clashing_or_missing_model_options_are_one_line_and_exit_2(argv, words, capsys):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_costs_still_takes_recompute_as_the_layer_recomputation(capsys):
    code, out, err = cli(capsys, "costs", *MODEL, "--recompute", "full")
    assert code == 0, err
    code, same, err = cli(capsys, "costs", *MODEL, "--layer-recompute", "full")
    assert code == 0 and out == same and "recompute full" in out
