"""Uneven model stages in the executor's models: each model stage its own number of
blocks (ExampleModel, the hf-* presets), from --layers-per-stage as counts or as the
split of a cost file's layers; refusals. No processes: the multi-process check that
gradients equal the reference is in test_executor_distributed (the UNEVEN cases)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pipesched.cli import build_parser, main  # noqa: E402
from pipesched.executor.hf_models import HFModel  # noqa: E402
from pipesched.executor.models import ExampleModel, ModelError  # noqa: E402
from pipesched.executor_args import model_from_args  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_example_model_stages_hold_their_own_block_counts(kind):
    model = ExampleModel(kind, hidden=8, layers_per_stage=(3, 1, 2), microbatch_size=2, seq=4).build(3, 2)
    assert [len(stage) for stage in model.stages] == [3, 1, 2]
    # the same model stage is initialised the same whatever the split of the others
    again = ExampleModel(kind, hidden=8, layers_per_stage=(3, 2, 2), microbatch_size=2, seq=4).build(3, 2)
    assert all(torch.equal(a, b) for a, b in zip(model.stages[0].state_dict().values(),
                                                 again.stages[0].state_dict().values()))


@pytest.mark.parametrize("counts, stages, message", [
    ((3, 1), 3, "gives 2 model stages"),
    ((3, 0), 2, "integers >= 1"),
    ((), 2, "integers >= 1"),
])
def test_example_model_refuses_bad_splits(counts, stages, message):
    with pytest.raises(ModelError, match=message):
        ExampleModel("mlp", layers_per_stage=counts).build(stages, 2)


@pytest.mark.skipif(not HAVE_HF, reason="needs transformers")
def test_hf_preset_takes_blocks_per_stage_with_empty_ends():
    spec = HFModel("hf-gpt2", hidden=8, layers_per_stage=(0, 2, 1, 0), microbatch_size=2, seq=4, vocab=32)
    model = spec.build(4, 2)
    blocks = [sum(len(m.blocks) for m in stage if hasattr(m, "blocks")) for stage in model.stages]
    assert blocks == [0, 2, 1, 0]
    with pytest.raises(ModelError, match="middle model stage"):
        HFModel("hf-gpt2", hidden=8, layers_per_stage=(1, 0, 1, 1), seq=4, vocab=32).build(4, 2)


def args_for(argv: list[str]):
    return build_parser().parse_args(argv)


def test_layers_per_stage_balanced_takes_the_cost_files_split(tmp_path):
    costs = tmp_path / "layers.json"
    costs.write_text(json.dumps({"layers": {"list": [{"forward": 3}] + [{"forward": 1}] * 5}}))
    schedule = build("1f1b", 2, 2)
    for how, want in (("balanced", (2, 4)), ("even", (3, 3))):
        args = args_for(["run", "1f1b", "-p", "2", "-m", "2", "--costs", str(costs), "--layers-per-stage", how])
        assert model_from_args(args, schedule).layers_per_stage == want


@pytest.mark.parametrize("flags, message", [
    (["--layers-per-stage", "3,1,1"], "gives 3 model stages, the schedule has 2"),
    (["--layers-per-stage", "3,x"], "a block count for every stage"),
    (["--layers-per-stage", "3,0"], "integers >= 1"),
    (["--layers-per-stage", "balanced"], "give --costs FILE with a layers section"),
])
def test_run_refuses_bad_layer_counts_in_one_line(capsys, flags, message):
    assert main(["run", "1f1b", "-p", "2", "-m", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_profiled_layers_give_a_cost_file_the_partitioner_splits():
    from pipesched.executor.layer_profile import profile_layers, with_measured_layers
    from pipesched.simulator.costs import CostModel, StageCost
    from pipesched.simulator.cost_file import from_dict, to_dict

    model = ExampleModel("mlp", hidden=8, layers_per_stage=(2, 1), microbatch_size=2).build(2, 2)
    layers, split = profile_layers(model, repeats=1, warmup=0)
    assert split == [2, 1] and len(layers.layers) == 3 and layers.embedding is None and layers.head is None
    assert all(l.forward > 0 and l.param_bytes == (8 * 32 + 32 + 32 * 8 + 8) * 4 for l in layers.layers)
    assert [l.activation_bytes for l in layers.layers] == [2 * 8 * 4, 2 * 8 * 4, 0.0]
    calibrated = CostModel(model_stages=(StageCost(), StageCost()))
    costs = with_measured_layers(calibrated, model, threads=1, repeats=1, warmup=0)
    assert costs.model_stages is None and costs.layers.partition == (2, 1)
    assert from_dict(to_dict(costs)).layers == costs.layers
    assert len(costs.meta["per_stage_measured"]) == 2


@pytest.mark.skipif(not HAVE_HF, reason="needs transformers")
def test_profiled_causal_lm_has_an_embedding_and_a_head():
    from pipesched.executor.layer_profile import profile_layers

    model = HFModel("hf-gpt2", hidden=8, layers_per_stage=(1, 2), microbatch_size=2, seq=4, vocab=64).build(2, 2)
    layers, split = profile_layers(model, repeats=1, warmup=0)
    assert split == [1, 2] and len(layers.layers) == 3
    assert layers.embedding is not None and layers.head is not None and layers.head.activation_bytes == 0
    assert layers.embedding.activation_bytes == 2 * 4 * 8 * 4  # (batch, seq, hidden) float32
