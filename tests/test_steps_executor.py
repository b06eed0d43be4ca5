"""Steps back to back on real process groups (gloo on CPU, p = 2): without a barrier
between steps every step's loss and the last step's gradients still match the
unpipelined model, and the run reports the period it measured."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from pipesched.executor.job import RunOptions, run_schedule  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.models import ExampleModel  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402

pytestmark = pytest.mark.distributed
MLP64 = ExampleModel("mlp", hidden=8, layers_per_stage=1, microbatch_size=4, dtype="float64")
NAMES = ("1f1b", "zb-h2", "zb-v")


def run_cases(ctx, cases):
    out = {}
    for name, schedule, options in cases:
        result = run_schedule(ctx, schedule, MLP64, options)
        if result is not None:
            out[name] = result
    return out if ctx.rank == 0 else None


@pytest.fixture(scope="module")
def results():
    cases = [(name, build(name, 2, 4), RunOptions(steps=4, warmup=1, step_barrier="none")) for name in NAMES]
    cases.append(("1f1b barrier", build("1f1b", 2, 4), RunOptions(steps=2, warmup=1)))
    return launch_local(run_cases, (cases,), 2, timeout=120)


@pytest.mark.parametrize("name", NAMES)
def test_steps_without_a_barrier_match_the_reference(results, name):
    r = results[name]
    c = r.check
    assert c.loss_matches and c.grads_match and c.max_grad_rel_error < 1e-6, (c.worst, c.max_grad_rel_error)
    losses = r.trace.meta["step_losses"]
    assert len(losses) == 4 and all(loss == c.reference_loss or abs(loss / c.reference_loss - 1) < 1e-12
                                    for loss in losses)
    assert r.step_barrier == "none" and r.period is not None and r.period > 0
    summary = r.summary()
    assert summary["period"] == r.period and summary["throughput"] == pytest.approx(4 / r.period)
    m = compute_metrics(r.trace)
    assert m.step_barrier == "none" and m.period == r.period and r.trace.meta["steps"]["period_method"] == "measured"


def test_a_barrier_run_reports_its_period_but_no_steps_meta(results):
    r = results["1f1b barrier"]
    assert r.check.loss_matches and r.check.grads_match
    assert r.step_barrier == "all" and r.period > 0 and "steps" not in r.trace.meta
    assert compute_metrics(r.trace).period is None


def test_step_barrier_is_checked():
    with pytest.raises(ValueError, match="step_barrier"):
        RunOptions(step_barrier="some").checked()
