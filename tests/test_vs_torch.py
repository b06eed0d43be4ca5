"""No built-in schedule is slower than torch.distributed.pipelining's of the same name."""
import pytest

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import build
from pipesched.simulator.costs import Link, Network, uniform

from helpers import makespan

pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
from pipesched.executor.torch_schedules import torch_schedule  # noqa: E402

PAIRS = [("gpipe", "GPipe", None), ("1f1b", "1F1B", None), ("interleaved-1f1b", "Interleaved1F1B", 2),
         ("interleaved-1f1b", "Interleaved1F1B", 3), ("looped-bfs", "LoopedBFS", 2),
         ("zb-v", "ZBVZeroBubble", None), ("dualpipev", "DualPipeV", None)]
COSTS = {
    "1,1,1": uniform(1, 1, 1),
    "1,2,1": uniform(1, 2, 1),
    "2,3,1": uniform(2, 3, 1),
    "1,1,1+comm": uniform(1, 1, 1, activation_bytes=1e6, network=Network(Link(0.2, 1e7))),
}


def cases():
    for ours, theirs, v in PAIRS:
        for p in (2, 3, 4, 6):
            for m in sorted({p, 2 * p, 2 * p + 1, 4 * p, 3}):
                yield ours, theirs, v, p, m


@pytest.mark.parametrize("ours,theirs,v,p,m", list(cases()))
def test_not_slower_than_torch(ours, theirs, v, p, m):
    try:
        reference = torch_schedule(theirs, p, m, v)
    except ScheduleError:
        pytest.skip(f"torch refuses {theirs} p={p} m={m}")
    for label, costs in COSTS.items():
        mine = build(ours, p, m, v, op_time=costs.op_time_for(p))
        assert makespan(mine, costs) <= makespan(reference, costs) + 1e-9, label


def test_torch_orders_import_as_valid_graphs():
    # torch's 2.13 reference facts (shared/reference.md), through our evaluator
    assert makespan(torch_schedule("GPipe", 4, 8)) == 33
    assert makespan(torch_schedule("Interleaved1F1B", 4, 8, 2)) == 28.5
    assert makespan(torch_schedule("DualPipeV", 4, 8)) == 27
    assert makespan(torch_schedule("ZBVZeroBubble", 4, 16), uniform(2, 3, 1)) == 102.0


def test_unknown_torch_schedule():
    with pytest.raises(ScheduleError, match="unknown torch schedule"):
        torch_schedule("Nope", 2, 4)


def test_side_by_side_rows_and_chart(tmp_path):
    from pipesched.executor.torch_schedules import SAME_NAME, compare_with_torch
    from pipesched.plots.vs_torch import plot_vs_torch

    rows = [{**r, "costs": [2, 3, 1]} for r in compare_with_torch(4, 16, uniform(2, 3, 1, activation_memory=1.0))]
    assert [r["schedule"] for r in rows] == [ours for ours, _, _ in SAME_NAME]
    measured = [r for r in rows if "refused" not in r]
    assert all(r["makespan"] <= r["torch_makespan"] and r["peak_memory"] <= r["torch_peak_memory"] for r in measured)
    assert next(r for r in rows if r["schedule"] == "zb-v")["makespan"] < 102.0
    assert "malformed" in next(r for r in rows if r["schedule"] == "1f1b")["refused"]
    out = plot_vs_torch(rows, tmp_path / "vs.png", "test")
    assert out.stat().st_size > 0


@pytest.mark.parametrize("args", [["import-torch", "GPipe", "-p", "2", "-m", "4"],
                                  ["export-torch", "torch:GPipe", "-p", "2", "-m", "4"],
                                  ["simulate", "torch:GPipe", "-p", "2", "-m", "4"]])
def test_missing_visualizer_is_one_line_naming_the_torch_version(monkeypatch, capsys, args):
    import sys

    import torch

    from pipesched.cli import main

    # None in sys.modules makes the import fail, as on a torch without the module
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining._schedule_visualizer", None)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "Traceback" not in err
    assert f"torch {torch.__version__} lacks" in err and "_schedule_visualizer" in err


def test_other_get_schedule_ops_signature_or_no_torch(monkeypatch):
    from torch.distributed.pipelining import _schedule_visualizer

    from pipesched.executor import torch_schedules

    monkeypatch.setattr(_schedule_visualizer, "get_schedule_ops", lambda schedule, pp_degree, num_microbatches: [])
    with pytest.raises(ScheduleError, match="get_schedule_ops does not take the arguments of 2.13"):
        torch_schedule("GPipe", 2, 4)
    monkeypatch.setattr(torch_schedules, "torch_version", lambda: None)
    with pytest.raises(ScheduleError, match=r"torch:GPipe needs torch \(pip install"):
        torch_schedule("GPipe", 2, 4)
