"""benchmarks/estimate_vs_published.py: the estimate it reports for a row of the zero-bubble
paper's Table 9 is `estimate()` of that row's model, and the published side is as typed."""
from __future__ import annotations

import pytest

from helpers import benchmark_module
from pipesched.simulator.estimate import Setup, estimate
from pipesched.simulator.hardware import hardware
from pipesched.simulator.model_config import ModelConfig


def test_first_row_is_the_estimate_of_a_middle_stage_of_the_1_5b_model():
    bench = benchmark_module("estimate_vs_published")
    row = bench.ROWS[0]
    # Table 9's first row and Table 3's 1.5B model, typed again here
    assert (row.model, row.p, row.m) == ("1.5B", 8, 24)
    assert (row.f, row.b, row.w) == (18.522, 18.086, 9.337)
    got = bench.compare(row)
    assert got.published == (18.522, 18.086, 9.337)
    assert got.layers == 3  # 22 layers over 8 stages, the first and last with one fewer: 2 + 6 x 3 + 2

    model = ModelConfig("gpt-1.5b", layers=22, hidden=2304, ffn=4 * 2304, heads=24, vocab=50257, tied=True,
                        norm="layernorm", bias=True, positions=2048, activation="gelu", dropout=True)
    setup = Setup(seq=1024, microbatch_size=6, dtype="fp16", tp=1, kernels="fused", attention="math")
    est = estimate(model, setup, hardware("a100-80gb"))
    assert (est.hardware.gpu.efficiency, est.hardware.gpu.memory_efficiency) == (0.75, 0.3)  # the defaults
    layer = est.layer
    direct = tuple(3 * w.total * 1e3 for w in (layer.forward, layer.backward_input, layer.backward_weight))
    assert got.estimated == pytest.approx(direct, rel=1e-12)
    assert got.errors == pytest.approx(tuple(e / p - 1 for e, p in zip(direct, (18.522, 18.086, 9.337))))
    assert got.saved_per_token == pytest.approx(layer.activation_memory / 6144)
    assert got.paper_saved_per_token == 34 * 2304 + 5 * 24 * 1024
    assert got.paper_kept_per_token == 32 * 2304


def test_middle_stages_have_table_3_layers_plus_two_over_p():
    bench = benchmark_module("estimate_vs_published")
    assert {r.model: bench.layers_per_stage(r) for r in bench.ROWS} == {"1.5B": 3, "6.2B": 4, "14.6B": 3, "28.3B": 2}
