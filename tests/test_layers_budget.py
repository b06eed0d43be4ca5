"""A model given layer by layer: its model stages carry every per-stage field of their
layers (weight gradients, the optimizer step, recomputation), and a byte limit leaves
zb-auto an activation limit from the stages of the split (`Budget.activation_limit`)."""
from __future__ import annotations

import math
from dataclasses import replace

from pipesched.simulator.budget import Budget, build_within
from pipesched.simulator.costs import CostModel, DataParallel, StageCost
from pipesched.simulator.layers import LayerCosts, sum_costs
from pipesched.simulator.api import simulate
from pipesched.simulator.metrics import compute_metrics

GIB = 2.0 ** 30


def test_a_stage_adds_up_its_layers_weight_gradients_and_optimizer_steps():
    layer = StageCost(1.0, 1.0, 1.0, param_bytes=10.0, weight_grad_bytes=4.0, optimizer_time=0.25)
    plain = StageCost(1.0, 1.0, 1.0, param_bytes=10.0)
    costs = LayerCosts((layer,) * 4, embedding=plain).check()
    first, second = costs.stage_costs([2, 2])
    assert (first.weight_grad_bytes, first.optimizer_time) == (10.0 + 8.0, 0.5)  # the embedding syncs its params
    assert (second.weight_grad_bytes, second.optimizer_time) == (8.0, 0.5)
    assert sum_costs([plain, plain], 0.0).weight_grad_bytes is None  # none stated: param_bytes is all-reduced
    marked = StageCost(2.0, 1.0, 1.0, recompute=True, recompute_fraction=0.5)
    stage = sum_costs([marked, StageCost(2.0, 1.0, 1.0, recompute=True)], 0.0)
    assert stage.recompute and stage.recompute_fraction == 0.75
    assert not sum_costs([marked, plain], 0.0).recompute


def test_the_step_tail_all_reduces_the_layers_weight_gradients():
    layer = StageCost(1.0, 1.0, 1.0, param_bytes=8e9, weight_grad_bytes=2e9, optimizer_time=0.5)
    dp = DataParallel(2, 0.0, 1e9)
    costs = CostModel(layers=LayerCosts((layer,) * 4), data_parallel=dp).check()
    stated = compute_metrics(simulate(build_within("1f1b", 2, 4, None, costs, Budget()), costs))
    params = CostModel(layers=LayerCosts((StageCost(1.0, 1.0, 1.0, param_bytes=8e9, optimizer_time=0.5),) * 4),
                       data_parallel=dp).check()
    synced = compute_metrics(simulate(build_within("1f1b", 2, 4, None, params, Budget()), params))
    # two layers a stage: 4 GB of gradients in a ring of 2 (2 GB each way at 1 GB/s), not 16 GB of parameters
    assert math.isclose(stated.allreduce_time / 2, 4.0, rel_tol=1e-9)
    assert math.isclose(synced.allreduce_time / 2, 16.0, rel_tol=1e-9)
    assert stated.makespan < synced.makespan


def test_a_byte_limit_gives_an_activation_limit_from_the_layers():
    layer = StageCost(1.0, 1.0, 1.0, activation_bytes=0.25 * GIB, activation_memory=GIB, weight_memory=0.5 * GIB,
                      param_bytes=GIB)
    head = StageCost(1.0, 1.0, 1.0, activation_memory=3 * GIB, param_bytes=2 * GIB)
    costs = CostModel(layers=LayerCosts((layer,) * 8, head=head, partition="even")).check()
    budget = Budget(memory_limit=40 * GIB)
    # p = 4, v = 1: two layers a stage; the last holds the head too (8 GiB a microbatch, 4 GiB of parameters)
    assert budget.activation_limit(costs, 4, 1) == math.floor(2 * (40 - 4 - 0.5) / 5) / 2
    # v = 2: one layer a chunk; on the V the last rank holds the head's chunk with the first's
    assert budget.activation_limit(costs, 4, 2) == math.floor(2 * (40 - 4 - 0.5) / 5) / 2
    assert budget.activation_limit(costs) is None  # which stages a rank holds needs the ranks
    assert Budget(max_activations=3, memory_limit=40 * GIB).activation_limit(costs, 4, 1) == 3
    # what B leaves for W counts where it is more than F stored
    heavy = CostModel(layers=LayerCosts((replace(layer, weight_memory=2 * GIB),) * 8, partition="even")).check()
    assert budget.activation_limit(heavy, 4, 1) == math.floor(2 * (40 - 2 - 0.5) / 4) / 2


def test_zb_auto_under_a_byte_limit_on_layers_fits_it():
    layer = StageCost(1.0, 1.2, 0.8, activation_bytes=0.1 * GIB, activation_memory=GIB, weight_memory=0.5 * GIB,
                      param_bytes=GIB)
    costs = CostModel(layers=LayerCosts((layer,) * 8)).check()
    budget = Budget(memory_limit=12 * GIB)
    schedule = build_within("zb-auto", 4, 16, 2, costs, budget)
    peak = max(r.peak_memory_bytes for r in compute_metrics(simulate(schedule, costs)).per_rank)
    assert peak <= 12 * GIB
