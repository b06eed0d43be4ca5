"""Uneven stages: the partitioner against brute force, hand cases, per-layer cost files,
the model stages a split makes, `simulate --partition`, and refusals of bad input."""
from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest

from pipesched.cli import main
from pipesched.schedules.registry import BUILDERS, build
from pipesched.simulator.costs import CostError, CostModel, StageCost
from pipesched.simulator.cost_file import from_dict, layers_from_dict, to_dict
from pipesched.simulator.layers import LayerCosts
from pipesched.simulator.partition import (PartitionError, balanced_split, even_split, min_layers,
                                           stage_loads)

from helpers import close, makespan


def splits(n: int, lows: list[int]):
    """Every split of n layers on len(lows) stages holding at least lows[k] each."""
    for cuts in itertools.combinations_with_replacement(range(n + 1), len(lows) - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, n))]
        if all(c >= lo for c, lo in zip(counts, lows)):
            yield counts


@pytest.mark.parametrize("seed", range(60))
def test_balanced_split_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    n, s = rng.randint(1, 8), rng.randint(1, 5)
    weights = [rng.choice([0.0, rng.uniform(0, 3), float(rng.randint(1, 3))]) for _ in range(n)]
    first = rng.choice([0.0, rng.uniform(0, 6)])
    last = rng.choice([0.0, rng.uniform(0, 6)])
    lows = min_layers(s, first > 0, last > 0)
    if n < sum(lows):
        with pytest.raises(PartitionError, match="cannot fill"):
            balanced_split(weights, s, first, last)
        return
    every = [(max(loads), sum(x * x for x in loads), counts)
             for counts in splits(n, lows) for loads in [stage_loads(weights, counts, first, last)]]
    best = min(b for b, _, _ in every)
    squares = min(q for b, q, _ in every if b <= best * (1 + 1e-9))
    got = balanced_split(weights, s, first, last)
    loads = stage_loads(weights, got, first, last)
    assert sum(got) == n and all(c >= lo for c, lo in zip(got, lows))
    assert close(max(loads), best)                       # the slowest stage is as fast as it can be
    assert close(sum(x * x for x in loads), squares)     # and the rest as even as they can be


def test_an_embedding_heavy_first_stage_gets_fewer_layers():
    # 12 equal layers of 1 s on 4 stages; the embedding costs 2 s, the head 0.5 s
    counts = balanced_split([1.0] * 12, 4, first=2.0, last=0.5)
    assert counts[0] < 3 and counts[0] == min(counts[:3])
    assert max(stage_loads([1.0] * 12, counts, 2.0, 0.5)) == 4.0  # ceil((12 + 2.5) / 4) = 4 layers' worth
    # a head as heavy as 3 layers leaves the last stage with none
    assert balanced_split([1.0] * 6, 3, last=3.0) == [3, 3, 0]
    assert balanced_split([1.0] * 6, 3, first=3.0) == [0, 3, 3]
    assert balanced_split([1.0, 1.0, 4.0, 1.0], 3) == [2, 1, 1]


def test_even_split_puts_the_remainder_on_middle_stages():
    assert even_split(8, 4) == [2, 2, 2, 2]
    assert even_split(5, 4) == [1, 2, 1, 1]
    assert even_split(2, 4, True, True) == [0, 1, 1, 0]
    with pytest.raises(PartitionError, match="3 layers cannot fill 4 model stages"):
        even_split(3, 4)


@pytest.mark.parametrize("weights, stages, message", [
    ([1.0, 1.0], 3, "2 layers cannot fill 3 model stages"),
    ([1.0, -1.0], 2, "layer 1's weight must be a finite number >= 0"),
    ([1.0, float("nan")], 2, "layer 1's weight"),
    ([1.0], 0, "must be an integer >= 1"),
])
def test_impossible_splits_are_refused(weights, stages, message):
    with pytest.raises(PartitionError, match=message):
        balanced_split(weights, stages)


LM = {"layer": {"forward": "10ms", "backward_input": "10ms", "backward_weight": "10ms", "activation_bytes": "1MiB",
                "activation_memory": "4MiB", "param_bytes": 1000},
      "count": 8,
      "embedding": {"forward": "2ms", "backward_weight": "4ms", "activation_bytes": "1MiB", "param_bytes": 5000},
      "head": {"forward": "20ms", "backward_input": "20ms", "backward_weight": "20ms", "param_bytes": 5000}}


def lm_costs(**changes) -> CostModel:
    return from_dict({"format": "pipesched.costs/1", "layers": {**LM, **changes}})


def test_model_stages_are_sums_of_their_layers():
    costs = lm_costs(partition=[1, 3, 3, 1])
    stages = costs.model_stage_costs(4, 4)
    assert [s.forward for s in stages] == pytest.approx([0.012, 0.03, 0.03, 0.03])
    assert [s.backward_input for s in stages] == pytest.approx([0.01, 0.03, 0.03, 0.03])
    assert [s.param_bytes for s in stages] == [6000, 3000, 3000, 6000]
    assert [s.activation_memory for s in stages] == [4 * 2 ** 20, 12 * 2 ** 20, 12 * 2 ** 20, 4 * 2 ** 20]
    assert [s.activation_bytes for s in stages] == [2 ** 20, 2 ** 20, 2 ** 20, 0]
    assert costs.layers.split(4) == [1, 3, 3, 1]
    # an embedding alone still sends its output on
    alone = lm_costs(partition=[0, 4, 4, 0]).model_stage_costs(4, 4)
    assert alone[0].activation_bytes == 2 ** 20 and alone[0].forward == pytest.approx(0.002)


def test_the_balanced_split_puts_fewer_layers_next_to_the_head():
    costs = lm_costs()
    assert costs.layers.split(4) == [2, 3, 3, 0]
    assert max(costs.layers.loads([2, 3, 3, 0])) == pytest.approx(0.09)
    assert max(costs.layers.loads(costs.layers.split(4, "even"))) == pytest.approx(0.12)


def test_the_layers_section_round_trips():
    costs = lm_costs(partition="even", objective="fb")
    again = from_dict(json.loads(json.dumps(to_dict(costs))))
    assert again.layers == costs.layers
    listed = from_dict({"layers": {"list": [{"forward": 1}, {"forward": 2, "backward_input": 1}], "partition": [1, 1]}})
    assert from_dict(to_dict(listed)).layers == listed.layers


def test_uniform_layers_split_evenly_give_the_1f1b_formula():
    # p equal stages of F = B = W = 3 x 0.1 s: 1F1B takes (m + p - 1)(F + B + W)
    p, m = 4, 6
    costs = from_dict({"layers": {"layer": {"forward": 0.1, "backward_input": 0.1, "backward_weight": 0.1},
                                  "count": 3 * p}})
    assert close(makespan(build("1f1b", p, m), costs), (m + p - 1) * 0.9)


def test_a_split_simulates_as_the_same_model_stages_given_by_hand():
    costs = lm_costs()
    by_hand = CostModel(stages=(StageCost(),), model_stages=tuple(costs.model_stage_costs(4, 4)))
    for name in ("1f1b", "zb-h1", "gpipe"):
        assert close(makespan(build(name, 4, 8), costs), makespan(build(name, 4, 8), by_hand))


def test_interleaved_schedules_split_the_layers_over_every_model_stage():
    costs = lm_costs(count=16)
    assert len(costs.model_stage_costs(4, 8)) == 8
    assert sum(costs.layers.split(8)) == 16


@pytest.mark.parametrize("layers, message", [
    ({"count": 0, "layer": {"forward": 1}}, "count must be an integer >= 1"),
    ({"layer": {"forward": 1}}, "needs count"),
    ({"list": []}, "non-empty list"),
    ({"list": [1, 2]}, "layers.list[0] must be an object"),
    ({"count": 2, "layer": {"forward": -1}}, "forward must be finite and >= 0"),
    ({"count": 2, "layer": {"forward": 1}, "partition": "fast"}, "partition must be balanced, even"),
    ({"count": 2, "layer": {"forward": 1}, "partition": [1, -1]}, "partition must be balanced, even"),
    ({"count": 2, "layer": {"forward": 1}, "objective": "x"}, "objective must be one of"),
    ({"count": 2, "layer": {"forward": 1}, "blocks": 3}, "unknown field 'blocks'"),
    ({"count": 3, "list": [{"forward": 1}]}, "count is 3 but layers.list has 1"),
])
def test_bad_layers_sections_are_refused(layers, message):
    with pytest.raises(CostError, match=message.replace("[", r"\[").replace("]", r"\]")):
        layers_from_dict(layers)


def test_layers_and_per_stage_costs_are_not_mixed():
    with pytest.raises(CostError, match="either layer by layer"):
        from_dict({"layers": {"count": 2, "layer": {"forward": 1}}, "stages": [{"forward": 1}]})
    with pytest.raises(CostError, match="either layer by layer"):
        from_dict({"layers": {"count": 2, "layer": {"forward": 1}}, "model_stages": [{"forward": 1}]})


def write(tmp_path, layers: dict, name: str = "costs.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"format": "pipesched.costs/1", "layers": layers}))
    return path


def test_simulate_shows_the_split_and_balanced_beats_even(tmp_path, capsys):
    path = write(tmp_path, LM)
    result = {}
    for how in ("balanced", "even"):
        assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--costs", str(path), "--partition", how,
                     "--json"]) == 0
        result[how] = json.loads(capsys.readouterr().out)
    assert result["balanced"]["layers"]["layers_per_stage"] == [2, 3, 3, 0]
    assert result["even"]["layers"]["layers_per_stage"] == [2, 2, 2, 2]
    assert result["balanced"]["makespan"] < result["even"]["makespan"]
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--costs", str(path)]) == 0
    assert "layers per model stage 2,3,3,0 (balanced" in capsys.readouterr().out


def refused(capsys, argv, message):
    assert main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and message in err and "internal error" not in err, err


def test_bad_partitions_are_refused_in_one_line(tmp_path, capsys):
    path = write(tmp_path, {**LM, "count": 2})
    sim = ["simulate", "1f1b", "-p", "4", "-m", "4", "--costs", path]
    refused(capsys, [*sim[:-2], "--partition", "even"], "--partition needs a cost file with a layers section")
    refused(capsys, [*sim, "--partition", "3,2,2"], "must be 4 integers")
    refused(capsys, [*sim, "--partition", "1,1,1,0"], "add up to 3, the model has 2 layers")
    refused(capsys, [*sim, "--partition", "a,b"], "expected balanced, even or layers per model stage")
    refused(capsys, [*sim, "--activation-bytes", "1MiB"], "layers section")
    no_extras = write(tmp_path, {"layer": {"forward": 1}, "count": 3}, "plain.json")
    refused(capsys, ["simulate", "1f1b", "-p", "4", "-m", "4", "--costs", no_extras],
            "3 layers cannot fill 4 model stages")
    refused(capsys, ["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", no_extras, "--partition", "3,0"],
            "model stage 1 holds no layer")


def test_the_docs_example_gives_the_split_it_shows(tmp_path, capsys):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "partition.md").read_text()
    path = tmp_path / "llama.toml"
    path.write_text(re.findall(r"```toml\n(.*?)```", doc, flags=re.S)[0])
    assert main(["simulate", "1f1b", "-p", "4", "-m", "32", "--costs", str(path)]) == 0
    shown = capsys.readouterr().out.splitlines()[-1]
    assert shown in " ".join(doc.split()), shown


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_builtin_runs_an_uneven_split(tmp_path, capsys, name):
    # a heavy head: model stages differ; zb-v's greedy candidates used to deadlock here
    path = write(tmp_path, LM)
    assert main(["simulate", name, "-p", "4", "-m", "8", "--costs", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(out["layers"]["layers_per_stage"]) == 8 and out["makespan"] > 0


def test_the_python_api_states_layers_directly():
    layer = StageCost(forward=0.01, backward_input=0.01, backward_weight=0.01, activation_bytes=1e6)
    head = StageCost(forward=0.03, backward_input=0.03, backward_weight=0.03)
    costs = CostModel(layers=LayerCosts((layer,) * 6, head=head)).check()
    assert costs.layers.split(3) == [3, 3, 0] and costs.layers.split(3, "even") == [2, 2, 2]
    assert [s.activation_bytes for s in costs.model_stage_costs(3, 3)] == [1e6, 1e6, 0.0]
    with pytest.raises(CostError, match="either as layers or as model_stages"):
        CostModel(layers=costs.layers, model_stages=(layer,)).check()


@pytest.mark.parametrize("seed", range(40))
def test_the_large_problem_partitioner_finds_what_the_small_one_does(seed, monkeypatch):
    # bisection on the slowest load and divide and conquer for the squares, forced on
    # problems the plain programme also solves
    import pipesched.simulator.partition as partition

    rng = random.Random(seed)
    n, s = rng.randint(20, 120), rng.randint(2, 9)
    weights = [rng.choice([0.0, 1.0, rng.uniform(0, 1), rng.uniform(0, 50)]) for _ in range(n)]
    first, last = rng.choice([0.0, rng.uniform(0, 20)]), rng.choice([0.0, rng.uniform(0, 20)])
    small = balanced_split(weights, s, first, last)
    monkeypatch.setattr(partition, "_DP_CELLS", -1)
    large = balanced_split(weights, s, first, last)
    a, b = stage_loads(weights, small, first, last), stage_loads(weights, large, first, last)
    assert close(max(a), max(b)) and close(sum(x * x for x in a), sum(x * x for x in b))


def test_the_largest_model_splits_in_seconds_and_larger_splits_are_refused():
    import time

    from pipesched.simulator.partition import MAX_LAYERS, MAX_STAGE_LAYERS
    rng = random.Random(0)
    weights = [rng.uniform(0.5, 1.5) for _ in range(MAX_LAYERS)]
    t0 = time.monotonic()
    counts = balanced_split(weights, 8, first=40.0, last=20.0)
    assert time.monotonic() - t0 < 10  # the O(S n^2) programme took minutes
    assert sum(counts) == MAX_LAYERS and max(stage_loads(weights, counts, 40.0, 20.0)) < sum(weights) / 8 + 45
    with pytest.raises(PartitionError, match=f"more than the {MAX_STAGE_LAYERS:,} stages x layers"):
        balanced_split(weights, MAX_STAGE_LAYERS // MAX_LAYERS + 1)
    with pytest.raises(PartitionError, match="more than the 100,000 a split takes"):
        balanced_split([1.0] * (MAX_LAYERS + 1), 2)
