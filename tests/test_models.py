"""Real models: a causal LM split into model stages (transformers' Llama and GPT-2, and a
plain-torch LM with tied embeddings), through every schedule at p = 2 and 4 against the
unpipelined model, calibration, the CLI's --model and its refusals.

Processes are expensive on 2 cores: one launch per group size runs every case (and the
p = 4 launch also calibrates). The transformers cases are skipped without transformers;
the tied plain-torch model runs everywhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import models_for_cli  # noqa: E402
from pipesched.cli import main  # noqa: E402
from pipesched.executor import replicas  # noqa: E402
from pipesched.executor.calibrate import CalibrationOptions, calibrate_here  # noqa: E402
from pipesched.executor.causal_lm import (balanced_counts, block_counts, even_counts, lm_parts,  # noqa: E402
                                          split_causal_lm, token_microbatches)
from pipesched.executor.hf_models import HFModel  # noqa: E402
from pipesched.executor.job import RunOptions, run_schedule  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.models import ModelError  # noqa: E402
from pipesched.executor.reference import reference_step  # noqa: E402
from pipesched.executor.validation import assemble  # noqa: E402
from pipesched.schedules.registry import BUILDERS, build  # noqa: E402
from pipesched.simulator.trace import COMPUTE  # noqa: E402

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="needs transformers (pip install 'pipesched[hf]')")

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(hidden=8, layers_per_stage=1, microbatch_size=2, seq=4, vocab=32)
GPT2_64 = HFModel("hf-gpt2", dtype="float64", **TINY)
LLAMA_64 = HFModel("hf-llama", dtype="float64", **TINY)
GPT2_32 = HFModel("hf-gpt2", dtype="float32", **TINY)
LLAMA_32 = HFModel("hf-llama", dtype="float32", **TINY)
# heavier head than a block: the last stage's costs must show it
CALIBRATED = HFModel("hf-gpt2", hidden=16, layers_per_stage=1, microbatch_size=2, seq=8, vocab=512, dtype="float32")


# --- splitting, without processes -----------------------------------------------------

@needs_hf
@pytest.mark.parametrize("spec", [GPT2_64, LLAMA_64], ids=lambda s: s.kind)
@pytest.mark.parametrize("balance", ["even", [0, 2, 1, 1], [2, 1, 1, 0]], ids=str)
def test_split_stages_compute_the_whole_model(spec, balance):
    model = spec.causal_lm(4)
    ids = spec.tokens(1)[:, :-1]
    want = model(input_ids=ids).logits
    stages = split_causal_lm(model, 4, balance)
    x = ids
    for stage in stages:
        x = stage(x)
    assert torch.equal(x, want)
    params = {id(p) for p in model.parameters()}
    split = {id(p) for s in stages for p in s.parameters()}
    assert split == params, "every parameter on some stage, nothing new"
    tied = stages[0][0].tokens.weight is stages[-1][-1].head.weight
    assert tied == (spec.kind == "hf-gpt2") == lm_parts(model).tied


def test_block_counts_even_and_balanced():
    assert even_counts(8, 4) == [2, 2, 2, 2]
    assert even_counts(5, 4) == [1, 2, 1, 1]  # the extra block goes to a middle stage
    assert even_counts(2, 4) == [0, 1, 1, 0]
    # a head as costly as four blocks: the last stage takes no block, the rest split evenly
    assert balanced_counts([1.0] * 6, 3, last=4.0) == [3, 3, 0]
    assert balanced_counts([1.0] * 6, 3, first=4.0) == [0, 3, 3]
    assert balanced_counts([1.0, 1.0, 4.0, 1.0], 3) == [2, 1, 1]


@needs_hf
def test_block_counts_refuse_bad_splits():
    parts = lm_parts(GPT2_64.causal_lm(4))
    for balance, message in ((["even"], "must be 4 non-negative"), ([1, 0, 2, 1], "middle model stage"),
                             ([1, 1, 1], "must be 4"), ("fast", "unknown balance"), ("cost", "example token ids")):
        with pytest.raises(ModelError, match=message):
            block_counts(parts, 4, balance)
    with pytest.raises(ModelError, match="cannot fill 8 model stages"):
        block_counts(parts, 8)
    with pytest.raises(ModelError, match="not a transformers causal LM"):
        lm_parts(nn.Linear(2, 2))
    with pytest.raises(ModelError, match="does not split into 3 microbatches"):
        token_microbatches(torch.zeros(4, 5, dtype=torch.long), 3)


@needs_hf
def test_cost_balance_covers_every_block():
    model = LLAMA_32.causal_lm(4)
    stages = split_causal_lm(model, 2, "cost", LLAMA_32.tokens(1))
    assert sum(len(m.blocks) for s in stages for m in s if hasattr(m, "blocks")) == 4


def test_shared_groups_find_tied_and_replicated_parameters():
    model = models_for_cli.tied_lm(4, 1)
    table = model.stages[0][0].table.weight
    one_each = replicas.shared_groups({k: [k] for k in range(4)}, model.stages)
    assert one_each == [replicas.SharedGroup((0, 3), ((0, 0),))]  # the table, on the first and last rank
    assert any(p is table for p in replicas.trainable(model.stages[3]))
    v_shape = replicas.shared_groups({0: [0], 1: [1], 2: [1], 3: [0]}, model.stages)
    assert v_shape == [], "both uses on rank 0: one object, one gradient, nothing to exchange"
    dualpipe = replicas.shared_groups({0: [0, 1], 1: [0, 1]}, models_for_cli.tied_lm(2, 1).stages)
    assert len(dualpipe) == 1 and dualpipe[0].ranks == (0, 1) and len(dualpipe[0].params) == 5


def test_reference_gives_a_tied_parameter_its_full_gradient():
    model = models_for_cli.tied_lm(3, 2)
    _, grads = reference_step(model)
    whole = [m for m in model.stages]
    table = whole[0][0].table.weight
    loss = 0
    for x, y in zip(model.inputs, model.targets):
        for stage in whole:
            x = stage(x)
        loss = loss + model.loss_fn(x, y) * model.scale
    (want,) = torch.autograd.grad(loss, [table])
    last = next(i for i, p in enumerate(replicas.trainable(whole[2])) if p is table)
    assert torch.allclose(grads[0][0], want, rtol=0, atol=1e-14)
    assert torch.equal(grads[0][0], grads[2][last])


# --- every schedule, one launch per group size -----------------------------------------

def run_cases(ctx, cases: list, calibrate: tuple | None = None) -> dict | None:
    out = {}
    for case_id, schedule, model in cases:
        result = run_schedule(ctx, schedule, model, RunOptions())
        if result is not None:
            out[case_id] = result
    if calibrate is not None:
        schedule, model = calibrate
        costs = calibrate_here(ctx, schedule, model, CalibrationOptions(repeats=2, warmup=1))
        result = run_schedule(ctx, schedule, model, RunOptions())
        if ctx.rank == 0:
            out["calibrated"] = (costs, result)
    return out if ctx.rank == 0 else None


def cases_for(p: int) -> list:
    m = 2 * p
    cases = []
    for name in BUILDERS:
        schedule = build(name, p, m)
        if p == 2 or not HAVE_HF:  # at p = 4, GPT-2 covers tied weights where it can run
            cases.append((f"{name} tied-lm", schedule, models_for_cli.tied_lm(schedule.num_model_stages, m)))
        if HAVE_HF:
            cases.append((f"{name} hf-gpt2", schedule, GPT2_64.build(schedule.num_model_stages, m)))
    if HAVE_HF:
        llama = ("1f1b", "zb-v", "dualpipe") if p == 2 else ("interleaved-1f1b", "dualpipev")
        for name in llama:
            schedule = build(name, p, m)
            cases.append((f"{name} hf-llama", schedule, LLAMA_64.build(schedule.num_model_stages, m)))
        if p == 2:
            for name, spec in (("zb-v", GPT2_32), ("1f1b", LLAMA_32)):
                schedule = build(name, p, m)
                cases.append((f"{name} {spec.kind} float32", schedule, spec.build(schedule.num_model_stages, m)))
    return cases


@pytest.fixture(scope="module")
def p2() -> dict:
    return launch_local(run_cases, (cases_for(2),), 2, timeout=120)


@pytest.fixture(scope="module")
def p4() -> dict:
    calibrate = (build("1f1b", 4, 4), CALIBRATED.build(4, 4)) if HAVE_HF else None
    return launch_local(run_cases, (cases_for(4), calibrate), 4, timeout=180)


def check_exact(result, tolerance: float) -> None:
    c = result.check
    assert c.max_grad_rel_error <= tolerance and c.loss_rel_error <= tolerance, (c.worst, c.max_grad_rel_error)
    assert c.replicas_identical


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c[0] for c in cases_for(2)])
def test_p2_matches_the_unpipelined_model(p2, case):
    check_exact(p2[case], 1e-5 if "float32" in case else 1e-6)


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c[0] for c in cases_for(4)])
def test_p4_matches_the_unpipelined_model(p4, case):
    check_exact(p4[case], 1e-6)


@pytest.mark.distributed
def test_tied_gradient_is_checked_on_both_holders(p2):
    # 1f1b at p = 2 holds the table on rank 0 (embedding) and rank 1 (head): the reference
    # compares both stages' copies, each with the full gradient
    c = p2["1f1b tied-lm"].check
    assert c.grads_match and c.max_grad_rel_error < 1e-12


@needs_hf
@pytest.mark.distributed
def test_calibration_shows_the_heavier_first_and_last_stages(p4):
    costs, result = p4["calibrated"]
    stages = costs.model_stages
    assert len(stages) == 4
    # bytes, not times: the embedding and head parameters, and the logits the loss keeps
    middle = stages[1].param_bytes
    assert stages[2].param_bytes == middle
    assert stages[0].param_bytes > 3 * middle and stages[3].param_bytes > 3 * middle
    assert stages[3].activation_memory > 2 * stages[1].activation_memory
    validation = assemble(build("1f1b", 4, 4), costs, result)  # simulate under the costs, compare with the run
    predicted = {(s.op, s.stage) for s in validation.predicted.spans(COMPUTE)}
    assert predicted == {(op, k) for op in ("F", "BW") for k in range(4)}
    summary = validation.summary()
    assert summary["loss_matches_reference"] is True and summary["predicted"]["makespan"] > 0


# --- the command line ---------------------------------------------------------------

def cli_json(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pipesched", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.distributed
def test_cli_runs_a_user_function():
    s = cli_json("run", "1f1b", "-p", "2", "-m", "2", "--model", "models_for_cli:tied_lm", "--steps", "1",
                 "--min-time", "0", "--warmup", "0")
    assert s["loss_matches_reference"] is True and s["max_grad_rel_error"] < 1e-12
    assert s["model"].startswith("tied-lm: 2 stages")


@needs_hf
@pytest.mark.distributed
def test_cli_validates_a_preset(tmp_path):
    s = cli_json("validate", "1f1b", "-p", "2", "-m", "2", "--model", "hf-gpt2", "--hidden", "16", "--seq", "8",
                 "--vocab", "64", "--dtype", "float64", "--steps", "1", "--warmup", "0", "--repeats", "1",
                 "--calibration-warmup", "0", "--out", str(tmp_path / "v"))
    assert s["loss_matches_reference"] is True and s["max_grad_rel_error"] < 1e-6
    assert s["model"].startswith("hf-gpt2: 2 stages")


@needs_hf
def test_the_causal_mask_is_built_without_deprecated_arguments():
    import warnings

    from pipesched.executor.causal_lm import _causal_mask
    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=32)
    h = torch.zeros(2, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        _causal_mask(config, h, torch.arange(4)[None])


@needs_hf
@pytest.mark.distributed
def test_an_hf_llama_run_prints_no_future_warning():
    # the launcher and every rank build the model: none of them may warn
    proc = subprocess.run([sys.executable, "-m", "pipesched", "run", "1f1b", "-p", "2", "-m", "2", "--model",
                           "hf-llama", "--hidden", "16", "--seq", "8", "--vocab", "64", "--steps", "1",
                           "--warmup", "0", "--min-time", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert proc.returncode == 0, proc.stderr
    assert "FutureWarning" not in proc.stderr and "DeprecationWarning" not in proc.stderr, proc.stderr


@pytest.mark.distributed
def test_cli_calibrates_a_user_function(tmp_path):
    doc = cli_json("calibrate", "zb-v", "-p", "2", "-m", "2", "--model", "models_for_cli:tied_lm", "--repeats", "1",
                   "--calibration-warmup", "0", "-o", str(tmp_path / "costs.json"))
    assert len(doc["model_stages"]) == 4


def refuse_launch(monkeypatch) -> None:
    from pipesched.executor import job, launch

    def boom(*args, **kwargs):
        raise AssertionError("launched processes for bad input")
    for module in (job, launch):
        monkeypatch.setattr(module, "launch_local", boom)
    monkeypatch.setattr(job, "run_here", boom)


@pytest.mark.parametrize("spec, message", [
    ("models_for_cli:", "is not package.module:function"),
    ("no_such_module_here:f", "cannot import no_such_module_here"),
    ("models_for_cli:missing", "has no missing"),
    ("models_for_cli:NOT_CALLABLE", "is a int, not a function"),
    ("models_for_cli:not_a_model", "returned tuple; it must be function(num_stages: int, microbatches: int)"),
    ("models_for_cli:unpicklable", "cannot be pickled"),
    ("models_for_cli:fails", "failed: RuntimeError: no data here"),
    ("models_for_cli:wrong_stage_count", "3 stage modules were given"),
    ("hf-bert", "unknown --model 'hf-bert'"),
])
@pytest.mark.parametrize("command", ["run", "calibrate", "validate"])
def test_cli_refuses_a_bad_model_in_one_line(monkeypatch, capsys, tmp_path, command, spec, message):
    refuse_launch(monkeypatch)
    extra = ["-o", str(tmp_path / "c.json")] if command == "calibrate" else []
    extra += ["--out", str(tmp_path / "v")] if command == "validate" else []
    assert main([command, "1f1b", "-p", "2", "-m", "2", "--model", spec, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("preset", ["hf-llama", "hf-gpt2"])
def test_cli_says_how_to_install_transformers(monkeypatch, capsys, preset):
    refuse_launch(monkeypatch)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    assert main(["run", "1f1b", "-p", "2", "-m", "2", "--model", preset]) == 2
    err = capsys.readouterr().err
    assert "need the transformers package (pip install 'pipesched[hf]')" in err and err.count("\n") == 1
