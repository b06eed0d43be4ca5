"""Executor pieces in one process: models and their checks, the split backward, memory
accounting, receive posting, and the `pipesched run` refusals before launch."""
from __future__ import annotations

import copy
import json
import time

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pipesched.executor.memory import MemoryLedger  # noqa: E402
from pipesched.executor.models import (ExampleModel, ModelError, PipelineModel, check_model, mse_loss,  # noqa: E402
                             split_sequential)
from pipesched.executor.reference import compare  # noqa: E402
from pipesched.executor.runtime import Posting  # noqa: E402
from pipesched.executor.stage import StageModule, held_bytes  # noqa: E402
from pipesched.cli import main as cli  # noqa: E402
from pipesched.schedules.graph import LOCAL  # noqa: E402
from pipesched.schedules.registry import BUILDERS, build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402


def stage(module: nn.Module, model_stage: int, num: int = 3) -> tuple[StageModule, MemoryLedger]:
    ledger = MemoryLedger(time.perf_counter, module.parameters())
    return StageModule(module, model_stage, num, mse_loss, 0.5, ledger), ledger


def run_backward(sm: StageModule, ledger: MemoryLedger, x, target, split: bool):
    """One F and its backward; returns (dx, flops of B, flops of W or BW, ledger bytes
    after F, after B)."""
    state, out = sm.forward(0, x, target if sm.is_last else None)
    after_f = ledger.current
    grad = None if sm.is_last else torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    with FlopCounterMode(display=False) as flops:
        if not split:
            return sm.backward_full(state, grad), 0, flops.get_total_flops(), after_f, None, None
        dx, held = sm.backward_input(state, grad)
        b_flops, after_b, kept = flops.get_total_flops(), ledger.current, held_bytes(held.boxes, held.groups)
        sm.backward_weight(held)
    return dx, b_flops, flops.get_total_flops() - b_flops, after_f, after_b, kept


class Twice(nn.Module):
    """One Linear applied twice: its parameters meet the input path at two nodes."""

    def __init__(self, hidden: int):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


@pytest.mark.parametrize("kind", ["mlp", "transformer", "tied"])
@pytest.mark.parametrize("model_stage", [0, 1, 2])
def test_split_backward_equals_fused_without_recomputing(kind, model_stage):
    ex = ExampleModel("mlp" if kind == "tied" else kind, hidden=32, layers_per_stage=2, microbatch_size=4, seq=8,
                      dtype="float64")
    base = Twice(32).double() if kind == "tied" else ex.build_stage(model_stage)
    x, target = ex.microbatch(0)
    results = []
    for split in (False, True):
        sm, ledger = stage(copy.deepcopy(base), model_stage)
        dx, b_flops, w_flops, after_f, after_b, kept = run_backward(sm, ledger, x.clone(), target, split)
        results.append((dx, [p.grad for p in sm.module.parameters()], b_flops, w_flops, after_f, after_b, kept))
        assert ledger.current == 0, "everything held for backward is released by its end"
    (dx_f, g_f, _, bw_flops, *_), (dx_s, g_s, b_flops, w_flops, after_f, after_b, kept) = results
    for a, b in zip(g_f, g_s):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    if model_stage == 0:
        assert dx_f is None and dx_s is None and b_flops == 0
    else:
        torch.testing.assert_close(dx_f, dx_s, rtol=1e-12, atol=0)
        assert b_flops > 0
    assert w_flops > 0 and after_b == kept, "between B and W the ledger holds exactly what W needs"
    if kind == "tied" and model_stage > 0:  # documented limitation: W re-walks the path between the uses
        assert bw_flops < b_flops + w_flops < bw_flops + b_flops
    else:
        assert b_flops + w_flops == bw_flops, "W must not redo B's work"


def test_split_backward_releases_input_side_tensors():
    ex = ExampleModel("mlp", hidden=16, layers_per_stage=2, microbatch_size=4, dtype="float64")
    sm, ledger = stage(ex.build_stage(1), 1)
    x, _ = ex.microbatch(0)
    state, out = sm.forward(0, x.clone(), None)
    saved = ledger.current
    _, held = sm.backward_input(state, torch.ones_like(out))
    captured = sum(t.untyped_storage().nbytes() for g in held.groups for grads in g.captured for t in grads
                   if t is not None and t.untyped_storage().data_ptr() != out.untyped_storage().data_ptr())
    # GELU's saved input (4 x 4h per block) is input-side only: B frees it
    assert ledger.current < saved + captured
    sm.backward_weight(held)
    assert ledger.current == 0


def test_ledger_counts_each_storage_once_and_ignores_parameters():
    weight = nn.Parameter(torch.zeros(100))
    ledger = MemoryLedger(time.perf_counter, [weight])
    x = torch.zeros(10, 10)
    keys = [ledger.hold(x), ledger.hold(x[2:]), ledger.hold(weight)]
    assert keys[2] is None and ledger.current == 400
    ledger.release(keys[0])
    assert ledger.current == 400
    ledger.release(keys[1])
    assert ledger.current == 0 and ledger.peak == 400 and ledger.levels[-1] == 0


def test_split_sequential_and_its_errors():
    seq = nn.Sequential(*(nn.Linear(4, 4) for _ in range(5)))
    pieces = split_sequential(seq, [2, 3])
    assert [len(p) for p in pieces] == [2, 3] and pieces[1][0] is seq[2]
    with pytest.raises(ModelError, match="covers 4 layers"):
        split_sequential(seq, [2, 2])
    with pytest.raises(ModelError, match="at least one layer"):
        split_sequential(seq, [5, 0])


def test_check_model_takes_stages_already_on_another_device():
    """A model reused by a second job has its stages on the GPU (a job moves them there)
    while its microbatches stay on the host: the check runs each stage where it lives."""
    vocab, hidden = 16, 8
    stages = [nn.Embedding(vocab, hidden).to("meta"), nn.Linear(hidden, vocab).to("meta")]
    tokens = [torch.randint(0, vocab, (2, 4)) for _ in range(2)]

    def loss(y, t):
        return nn.functional.cross_entropy(y.flatten(0, 1), t.flatten())
    specs = check_model(PipelineModel(stages, loss, tokens, tokens), 2, 2)
    assert [s.shape for s in specs] == [(2, 4, hidden), (2, 4, vocab)]


@pytest.mark.filterwarnings("ignore:Using a target size")
def test_check_model_refuses_bad_models():
    ex = ExampleModel(hidden=8)
    good = ex.build(3, 2)
    assert [s.shape for s in check_model(good, 3, 2)] == [(8, 8)] * 3
    with pytest.raises(ModelError, match="3 model stages, but 2 stage modules"):
        check_model(PipelineModel(good.stages[:2], mse_loss, good.inputs, good.targets), 3, 2)
    broken = [good.stages[0], nn.Linear(5, 8), good.stages[2]]
    with pytest.raises(ModelError, match=r"model stage 1 fails on the output of model stage 0 \(\(8, 8\)"):
        check_model(PipelineModel(broken, mse_loss, good.inputs, good.targets), 3, 2)
    with pytest.raises(ModelError, match="inputs\\[1\\] differs"):
        check_model(PipelineModel(good.stages, mse_loss, [good.inputs[0], torch.zeros(3, 8)], good.targets), 3, 2)
    with pytest.raises(ModelError, match="loss fails"):
        check_model(PipelineModel(good.stages, mse_loss, good.inputs, [torch.zeros(2, 3)] * 2), 3, 2)
    with pytest.raises(ModelError, match="carries no gradient"):
        check_model(PipelineModel([nn.Identity()] + good.stages[1:], mse_loss, good.inputs, good.targets), 3, 2)
    with pytest.raises(ModelError, match="--hidden"):
        ExampleModel(hidden=0).check()


def test_reference_comparison_detects_a_wrong_gradient():
    model = ExampleModel(hidden=8, dtype="float64").build(2, 2)
    ref = copy.deepcopy(model)
    loss = 0.0
    for x, y in zip(ref.inputs, ref.targets):
        for s in ref.stages:
            x = s(x)
        out = mse_loss(x, y) * ref.scale
        out.backward()
        loss += float(out.detach())
    grads = {k: [p.grad for p in s.parameters()] for k, s in enumerate(ref.stages)}
    good = compare(model, loss, grads)
    assert good.loss_matches and good.grads_match and good.max_grad_rel_error < 1e-12
    grads[1][0] = grads[1][0] * (1 + 1e-3)
    bad = compare(model, loss, grads)
    assert not bad.grads_match and bad.worst == "model stage 1: 0.fc1.weight"


@pytest.mark.parametrize("name", list(BUILDERS))
def test_posting_covers_every_receive_before_its_op(name):
    graph = validate(build(name, 4, 8))
    for rank in range(4):
        units = [graph.units[u] for u in graph.rank_units[rank]]
        recv = [[e for t in unit for e in graph.task_inputs[t] if graph.edges[e].kind != LOCAL] for unit in units]
        for lookahead, in_order in ((2, False), (-1, False), (0, True)):
            plan = Posting(graph, rank, recv, lookahead, in_order)
            posted_by = {}
            for i, edges in enumerate(plan.before):
                for e in edges:
                    assert e not in posted_by, "each receive is posted once"
                    posted_by[e] = i
            assert all(posted_by[e] <= i for i, edges in enumerate(recv) for e in edges)
            if in_order:  # NCCL: each link's receives in the sender's order
                flat = [e for edges in plan.before for e in edges]
                for src in range(4):
                    mine = [e for e in flat if graph.edge_ranks(e)[0] == src]
                    sender = [e for u in graph.rank_units[src] for t in graph.units[u]
                              for e in graph.task_outputs[t] if e in set(mine)]
                    assert mine == sender


def refuse_launch(monkeypatch):
    from pipesched.executor import job

    def boom(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(job, "launch_local", boom)
    monkeypatch.setattr(job, "run_here", boom)


def test_launch_refuses_bad_stage_modules_before_starting(monkeypatch):
    from pipesched.executor.job import launch
    refuse_launch(monkeypatch)
    model = ExampleModel(hidden=8).build(2, 4)
    with pytest.raises(ModelError, match="4 model stages, but 2 stage modules"):
        launch(build("interleaved-1f1b", 2, 4, 2), model)
    model.stages[1] = nn.Sequential(nn.Linear(3, 8))
    with pytest.raises(ModelError, match="model stage 1 fails on the output of model stage 0"):
        launch(build("1f1b", 2, 4), model)


@pytest.mark.parametrize("argv, message", [
    (["dualpipe", "-p", "3", "-m", "4"], "even number of ranks"),
    (["1f1b", "-p", "2", "-m", "4", "--hidden", "0"], "--hidden must be"),
    (["1f1b", "-p", "2", "-m", "4", "--model", "transformer", "--hidden", "100"], "multiple of 3"),
    (["1f1b", "-p", "2", "-m", "4", "--steps", "0"], "--steps >= 1"),
    (["1f1b", "-p", "2", "-m", "4", "--timeout", "0"], "--timeout"),
])
def test_run_refuses_bad_arguments_before_launch(monkeypatch, capsys, argv, message):
    refuse_launch(monkeypatch)
    assert cli(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_run_refuses_gpu_backends_without_a_gpu(monkeypatch, capsys):
    refuse_launch(monkeypatch)
    for backend in ("nccl", "gloo-cuda"):
        assert cli(["run", "1f1b", "-p", "2", "-m", "2", "--backend", backend]) == 2
        assert "needs CUDA" in capsys.readouterr().err


def test_run_refuses_a_deadlocked_schedule_file(monkeypatch, capsys, tmp_path):
    refuse_launch(monkeypatch)
    doc = {"format": "pipesched.schedule/1", "name": "crossed", "ranks": 2, "microbatches": 1,
           "stages": [{"rank": 0, "model_stage": 0}, {"rank": 1, "model_stage": 1}], "paths": [[0, 1]],
           "programs": [[{"op": "BW", "mb": 0, "stage": 0}, {"op": "F", "mb": 0, "stage": 0}],
                        [{"op": "F", "mb": 0, "stage": 1}, {"op": "BW", "mb": 0, "stage": 1}]]}
    path = tmp_path / "crossed.json"
    path.write_text(json.dumps(doc))
    assert cli(["run", str(path)]) == 2
    assert "deadlocks" in capsys.readouterr().err


def test_runs_in_turn_build_each_example_model_once_per_split():
    """`validate A,B,...` holds one copy of the network per split, not one per schedule."""
    from pipesched.executor.job import RunOptions, share_built_models

    model = ExampleModel("mlp", hidden=16, layers_per_stage=2)
    halved = ExampleModel("mlp", hidden=16, layers_per_stage=1)
    options = RunOptions(steps=1, warmup=0)
    runs = [(build("1f1b", 2, 4), model, options), (build("zb-h1", 2, 4), model, options),
            (build("gpipe", 2, 4), ExampleModel("mlp", hidden=16, layers_per_stage=2), options),
            (build("zb-v", 2, 4), halved, options), (build("interleaved-1f1b", 2, 4), halved, options)]
    built = share_built_models(runs)
    assert built[0] is built[1] is built[2]  # equal descriptions at one split: one build
    assert built[3] is built[4] and built[3] is not built[0]
    assert len(built[0].stages) == 2 and len(built[3].stages) == 4
    mine = PipelineModel([nn.Linear(2, 2)], mse_loss, [], [])
    assert share_built_models([(build("1f1b", 1, 1), mine, options)])[0] is mine
