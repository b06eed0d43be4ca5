"""Costs of a cluster you do not have (`pipesched costs`, `simulator.estimate`): the FLOP and
byte formulas on tiny configs, Korthikanti et al.'s activation formula, the presets'
parameter counts, config.json reading, uneven first and last stages, the CLI's output
and its refusals, and one layer's saved activations counted on the CPU."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from pipesched.cli import main
from pipesched.simulator.cost_file import load
from pipesched.simulator.costs import Link
from pipesched.simulator.estimate import (CAUSAL_SHARE, FLASH_BACKWARD, EstimateError, Setup, allreduce_time,
                                          estimate, gather_time)
from pipesched.simulator.hardware import GpuKind, Hardware, HardwareError, hardware, with_overrides
from pipesched.simulator.model_config import (PRESETS, PUBLISHED_PARAMS, ModelConfig, ModelConfigError,
                                              from_hf_dict, preset)


def machine(rate: float = 1e12, bandwidth: float = 1e15, link: Link = Link(1e-6, 1e11)) -> Hardware:
    """A made-up GPU: `rate` FLOP/s in every dtype and `bandwidth` bytes/s, both reached in full."""
    gpu = GpuKind("test", {"bf16": rate, "fp16": rate, "fp32": rate}, bandwidth, 2.0 ** 40, 1.0, memory_efficiency=1.0)
    return Hardware(gpu, link, Link(1e-5, 1e10), 8).check()


def gpt(h: int = 64, heads: int = 4, dropout: bool = False) -> ModelConfig:
    return ModelConfig("tiny-gpt", layers=4, hidden=h, ffn=4 * h, heads=heads, vocab=1000, tied=True,
                       norm="layernorm", bias=False, positions=256, activation="gelu", dropout=dropout)


def llama(h: int = 64) -> ModelConfig:
    return ModelConfig("tiny-llama", layers=6, hidden=h, ffn=3 * h, heads=8, kv_heads=4, vocab=500, gated=True,
                       norm="rmsnorm", activation="silu")


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


# --- FLOPs and bytes ----------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layer_flops_are_the_gemms_and_causal_attention(tp):
    m, s, b = llama(), 32, 2
    T, h, f, hq, hkv = s * b, m.hidden, m.ffn, m.q_width, m.kv_width
    est = estimate(m, Setup(seq=s, microbatch_size=b, dtype="bf16", tp=tp), machine())
    gemm = 2 * T * (h * (hq + 2 * hkv) + hq * h + h * 2 * f + f * h) / tp
    attention = 4 * b * s * s * hq / tp * CAUSAL_SHARE
    assert isclose(est.layer.forward.flops, gemm + attention)
    assert isclose(est.layer.backward_input.flops, gemm + FLASH_BACKWARD * attention)
    assert isclose(est.layer.backward_weight.flops, gemm)
    # compute-bound here: the GEMM seconds are their FLOPs over the rate
    assert isclose(est.layer.forward.seconds["gemm"], gemm / 1e12)


def test_a_memory_bound_gemm_takes_its_bytes_over_the_bandwidth():
    m = gpt()
    est = estimate(m, Setup(seq=8, dtype="fp32"), machine(rate=1e18, bandwidth=1e9))
    T, e = 8, 4
    gemm_bytes = sum(e * (T * k + k * n + T * n) for _, k, n, _ in m.layer_matrices())
    assert isclose(est.layer.forward.seconds["gemm"], gemm_bytes / 1e9)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_communication(sp):
    m, link = gpt(), Link(2e-6, 5e10)
    est = estimate(m, Setup(seq=64, tp=4, sp=sp), machine(link=link))
    n = 2 * 64 * m.hidden  # bf16 activation of one microbatch
    if sp:
        assert isclose(est.layer.forward.seconds["tp_comm"], 4 * gather_time(n, 4, link))
        assert isclose(est.layer.backward_weight.seconds["tp_comm"], 2 * gather_time(n, 4, link))
    else:
        assert isclose(est.layer.forward.seconds["tp_comm"], 2 * allreduce_time(n, 4, link))
        assert "tp_comm" not in est.layer.backward_weight.seconds
    assert isclose(allreduce_time(n, 4, link), 2 * gather_time(n, 4, link))


def korthikanti(s, b, h, a, t=1, sp=False, selective=False) -> float:
    """Korthikanti et al. 2022, bytes per layer for fp16 activations with dropout."""
    quadratic = 0.0 if selective else 5 * a * s / h
    if sp:
        return s * b * h * (34 + quadratic) / t
    return s * b * h * (10 + 24 / t + quadratic / t)


@pytest.mark.parametrize("tp,sp,recompute", [(1, False, "none"), (4, False, "none"), (4, True, "none"),
                                             (1, False, "selective"), (4, True, "selective")])
def test_activation_memory_is_korthikantis_formula(tp, sp, recompute):
    s, b, m = 128, 2, gpt(h=64, heads=4, dropout=True)
    est = estimate(m, Setup(seq=s, microbatch_size=b, dtype="fp16", tp=tp, sp=sp, recompute=recompute,
                            kernels="fused", attention="math"), machine())
    stats = est.layer.saved["norm1"] + est.layer.saved["norm2"] - 2 * 2 * s * b * m.hidden / (tp if sp else 1)
    got = est.layer.activation_memory - stats   # the norms' mean and rstd: not in the paper's count
    assert isclose(got, korthikanti(s, b, m.hidden, m.heads, tp, sp, recompute == "selective"))


def test_full_recompute_keeps_the_layer_input_and_b_includes_r():
    s, b, m = 64, 2, gpt()
    plain = estimate(m, Setup(seq=s, microbatch_size=b, tp=2, sp=True), machine())
    full = estimate(m, Setup(seq=s, microbatch_size=b, tp=2, sp=True, recompute="full"), machine())
    assert isclose(full.layer.activation_memory, 2 * s * b * m.hidden / 2)
    assert isclose(full.layer.recompute, plain.layer.forward.total)
    layer = full.layer_costs().layers[0]
    assert isclose(layer.backward_input, plain.layer.backward_input.total + plain.layer.forward.total)
    assert full.layer.weight_memory == plain.layer.weight_memory  # W still needs its GEMMs' inputs


def test_weight_memory_boundary_bytes_and_parameter_bytes():
    s, b, m = 16, 2, gpt()
    T, h = s * b, m.hidden
    est = estimate(m, Setup(seq=s, microbatch_size=b, dtype="fp32"), machine())
    # inputs and output gradients of the 4 GEMMs (h+3h, h+h, h+4h, 4h+h) and of 2 norms (2 x 2h)
    assert isclose(est.layer.weight_memory, 4 * T * (4 + 2 + 5 + 5 + 4) * h)
    assert isclose(est.layer.activation_bytes, 4 * T * h)
    assert isclose(est.layer.param_bytes, 16 * m.layer_params())          # fp32 Adam: 4 + 4 + 8
    mixed = estimate(m, Setup(seq=s, microbatch_size=b, tp=2, sp=True, dp=8, zero=1), machine())
    assert isclose(mixed.layer.activation_bytes, 2 * T * h / 2)
    per_rank = sum(i * o for _, i, o, _ in m.layer_matrices()) / 2 + 2 * m.norm_params()
    assert isclose(mixed.layer.param_bytes, per_rank * (2 + 2 + 12 / 8))
    assert isclose(mixed.layer.grad_bytes, per_rank * 2)
    # a layers section all-reduces param_bytes: the bandwidth is scaled to move the gradients' time
    assert isclose(mixed.data_parallel.bandwidth, hardware_link(mixed).bandwidth * (2 + 2 + 12 / 8) / 2)


def hardware_link(est):
    return est.hardware.intra if est.setup.tp * est.setup.dp <= est.hardware.ranks_per_node else est.hardware.inter


def test_the_head_holds_fp32_logits_and_the_embedding_has_no_input_gradient():
    s, b, m = 64, 2, llama()
    est = estimate(m, Setup(seq=s, microbatch_size=b, tp=2), machine())
    assert isclose(est.head.saved["logits"], 4 * s * b * m.vocab / 2)
    assert est.embedding.backward_input.total == 0 and est.embedding.forward.total > 0
    assert est.head.activation_bytes == 0


# --- presets and config.json -----------------------------------------------------------

@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_have_their_published_parameter_counts(name):
    config = preset(name)
    assert abs(config.total_params() / PUBLISHED_PARAMS[name] - 1) < 0.02


def test_hf_configs_llama_and_gpt2_style():
    llama_json = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "tie_word_embeddings": False, "hidden_act": "silu"}
    c = from_hf_dict(llama_json)
    assert c.gated and not c.tied and c.kv_heads == 8 and c.norm == "rmsnorm"
    assert c.total_params() == preset("llama3-8b").total_params()
    g = from_hf_dict({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
                      "vocab_size": 50257, "n_positions": 1024})
    assert not g.gated and g.tied and g.ffn == 3072 and g.bias and g.positions == 1024
    assert g.activation == "gelu_new"
    with pytest.raises(ModelConfigError, match="mixture of experts"):
        from_hf_dict({**llama_json, "num_local_experts": 8})
    with pytest.raises(ModelConfigError, match="hidden_size"):
        from_hf_dict({"model_type": "llama", "num_hidden_layers": 2})
    with pytest.raises(ModelConfigError, match="layers must be an integer in 1..100,000"):
        from_hf_dict({**llama_json, "num_hidden_layers": 10 ** 9})


def test_bad_setups_name_the_bound():
    m = preset("llama3-8b")
    for setup, match in ((Setup(seq=0), "--seq must be an integer in 1"), (Setup(seq=4096, tp=3), "does not divide"),
                         (Setup(seq=4096, sp=True), "give --tp > 1"),
                         (Setup(seq=4096, zero=1), "give --dp > 1"), (Setup(seq=4096, dtype="int8"), "--dtype")):
        with pytest.raises(EstimateError, match=match):
            estimate(m, setup, hardware("h100-sxm"))
    with pytest.raises(EstimateError, match="spans nodes"):
        estimate(m, Setup(seq=4096, tp=8), replace(hardware("h100-sxm"), ranks_per_node=4))
    with pytest.raises(EstimateError, match="learned positions"):
        estimate(preset("gpt3-125m"), Setup(seq=4096), hardware("a100-80gb"))
    with pytest.raises(EstimateError, match="beyond any machine"):
        estimate(preset("llama3-405b"), Setup(seq=1 << 24, microbatch_size=1 << 20), hardware("h200"))


def test_hardware_kinds_and_overrides():
    h100 = hardware("h100-sxm")
    assert h100.gpu.peak_flops["bf16"] == 989.5e12 and h100.gpu.efficiency == 0.75
    assert hardware("h200").gpu.hbm_bandwidth == 4.8e12 and hardware("a100-80gb").gpu.peak_flops["bf16"] == 312e12
    over = with_overrides(None, {"gpu": "h100-sxm", "efficiency": 0.4, "peak_flops": {"bf16": "800TFLOP/s"},
                                 "inter_node": {"bandwidth": "200Gbit/s"}})
    assert over.gpu.flops("bf16") == 0.4 * 800e12 and over.inter.bandwidth == 25e9
    assert over.gpu.memory_rate == 0.3 * 3.35e12
    for bad, match in (({"efficiency": 2}, "efficiency"), ({"gpu": "tpu"}, "unknown GPU kind"),
                       ({"memory_efficiency": 0}, "memory_efficiency"), ({"colour": 1}, "unknown field")):
        with pytest.raises(HardwareError, match=match):
            with_overrides(h100, bad)


def test_memory_bound_work_runs_at_the_memory_efficiency_and_gemms_do_not():
    """Halving memory_efficiency doubles the elementwise seconds of every op and leaves the
    GEMMs' and attention's alone (they are compute-bound at these sizes)."""
    setup = Setup(seq=4096, microbatch_size=1, kernels="eager")
    full = with_overrides(hardware("h200"), {"memory_efficiency": 0.6})
    half = with_overrides(hardware("h200"), {"memory_efficiency": 0.3})
    a = estimate(preset("llama3-8b"), setup, full).layer.summary()["seconds_by_kind"]
    b = estimate(preset("llama3-8b"), setup, half).layer.summary()["seconds_by_kind"]
    for op in "FBW":
        assert b[op]["elementwise"] == pytest.approx(2 * a[op]["elementwise"], rel=1e-12)
        assert b[op]["gemm"] == a[op]["gemm"]
    assert b["F"]["attention"] == a["F"]["attention"]


# --- uneven stages, the cost file and the CLI ---------------------------------------------

def test_first_and_last_stages_are_uneven_and_balanced_splits_them():
    est = estimate(preset("llama3-8b"), Setup(seq=4096, tp=2, sp=True), hardware("h100-sxm"))
    costs = est.cost_model()
    counts = costs.layers.split(4)
    assert sum(counts) == 32 and counts[-1] < max(counts)   # the head costs more than a layer
    stages = costs.layers.stage_costs(counts)
    middle = stages[1]
    assert stages[0].param_bytes > middle.param_bytes * counts[0] / counts[1]     # the embedding table
    assert stages[-1].activation_memory > middle.activation_memory * counts[-1] / counts[1]  # the logits
    assert stages[-1].activation_bytes == 0 and stages[0].activation_bytes == middle.activation_bytes


def test_costs_command_writes_a_cost_file_that_simulate_and_plan_take(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["costs", "--model-preset", "llama3-8b", "--gpu", "h100-sxm", "--tp", "4", "--sp", "--seq", "4096",
                 "--dp", "2", "--zero", "1", "-p", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "layers per stage" in text and "E+" in text and "+H" in text and "wrote" in text
    costs = load(out)
    assert len(costs.layers.layers) == 32 and costs.layers.head is not None
    assert json.loads(out.read_text())["meta"]["estimate"]["hardware"]["gpu"] == "h100-sxm"
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--costs", str(out), "--partition", "balanced"]) == 0
    assert "layers per model stage" in capsys.readouterr().out
    assert main(["plan", "-p", "4", "-m", "8", "--schedules", "1f1b,zb-h1", "--costs", str(out),
                 "--partition", "balanced", "--memory-limit", "80GB"]) == 0


def test_costs_command_reads_a_config_json_and_a_hardware_file(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 4, "n_embd": 128, "n_head": 4,
                                  "vocab_size": 1000, "n_positions": 512}))
    hw = tmp_path / "hw.toml"
    hw.write_text('gpu = "a100-80gb"\nefficiency = 0.4\n[intra_node]\nbandwidth = "100GB/s"\n')
    assert main(["costs", "--model-config", str(config), "--hardware", str(hw), "--seq", "256", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["estimate"]["hardware"]["efficiency"] == 0.4 and doc["layers"]["count"] == 4


@pytest.mark.parametrize("argv,words", [
    (["--model-preset", "llama3-8b", "--gpu", "h100-sxm", "--seq", "4096", "--tp", "3"], "does not divide"),
    (["--model-preset", "llama9", "--gpu", "h100-sxm", "--seq", "4096"], "unknown model preset"),
    (["--model-preset", "llama3-8b", "--seq", "4096"], "give --gpu"),
    (["--model-preset", "llama3-8b", "--gpu", "b200", "--seq", "4096"], "unknown GPU kind"),
    (["--model-preset", "llama3-8b", "--gpu", "h100-sxm", "--seq", "-1"], "--seq must be"),
    (["--model-preset", "llama3-8b", "--gpu", "h100-sxm", "--seq", "4096", "--efficiency", "1.5"], "efficiency"),
    (["--model-config", "/nonexistent/config.json", "--gpu", "h100-sxm", "--seq", "4096"], "cannot read"),
    (["--gpu", "h100-sxm", "--seq", "4096"], "one of the arguments"),
])
def test_costs_command_refuses_bad_input_in_one_line(argv, words, capsys):
    assert main(["costs", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


# --- what autograd saves, counted on the CPU ----------------------------------------------

def test_one_layer_saves_what_the_estimate_says():
    torch = pytest.importorskip("torch")
    from torch.autograd.graph import saved_tensors_hooks

    from pipesched.executor.models import TransformerBlock

    h, s, b = 64, 16, 2
    block = TransformerBlock(h, h // 32)
    x = torch.randn(b, s, h, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        block(x)
    config = ModelConfig("block", layers=1, hidden=h, ffn=4 * h, heads=h // 32, vocab=1, bias=True)
    est = estimate(config, Setup(seq=s, microbatch_size=b, dtype="fp32", kernels="eager"), machine())
    assert abs(est.layer.activation_memory / sum(seen.values()) - 1) < 0.10
