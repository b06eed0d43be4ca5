"""Our schedules on torch.distributed.pipelining's own runtime: `pipesched export-torch`
writes the CSV, torch's `_PipelineScheduleRuntime._load_csv` loads it and runs it on gloo
with p = 2. zb-h2 (torch has no ZB-H2) and a hand-written V file with an overlapped pair
must give the unpipelined reference's loss and gradients. Also: what the export refuses,
that every exportable built-in loads in torch, and one-line errors where torch lacks a
private API. Both runs share one launch (processes are expensive on 2 cores).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from pipesched.schedules.ir import ScheduleError  # noqa: E402

try:
    from pipesched.executor import torch_runtime  # noqa: E402
    torch_runtime.runtime_class()
except ScheduleError as exc:  # this torch lacks the private runtime: say which and why
    pytest.skip(str(exc), allow_module_level=True)

import torch  # noqa: E402
import torch.distributed.pipelining.schedules as torch_schedules  # noqa: E402

from pipesched.executor.models import ExampleModel  # noqa: E402
from pipesched.cli import main  # noqa: E402
from pipesched.schedules import fileformat, torch_format  # noqa: E402
from pipesched.schedules.registry import BUILDERS, build  # noqa: E402

MLP64 = ExampleModel("mlp", hidden=8, layers_per_stage=1, microbatch_size=4, dtype="float64")


def task(op: str, mb: int, stage: int) -> dict:
    return {"op": op, "mb": mb, "stage": stage}


# A V on two ranks that torch has no class for: model stages 0 and 3 on rank 0, 1 and 2
# on rank 1 (a local turn each way), fused and split backwards mixed, and a DualPipe-style
# overlapped pair (a forward of stage 3 with a backward of stage 0) on rank 0.
HAND_V = {
    "format": "pipesched.schedule/1", "name": "hand-v3", "ranks": 2, "microbatches": 3,
    "stages": [{"rank": 0, "model_stage": 0}, {"rank": 1, "model_stage": 1},
               {"rank": 1, "model_stage": 2}, {"rank": 0, "model_stage": 3}],
    "paths": [[0, 1, 2, 3]],
    "programs": [
        [task("F", 0, 0), task("F", 1, 0), task("F", 0, 3), task("BW", 0, 3), task("F", 2, 0), task("F", 1, 3),
         task("B", 1, 3), [task("F", 2, 3), task("BW", 0, 0)], task("W", 1, 3), task("BW", 2, 3),
         task("B", 1, 0), task("W", 1, 0), task("BW", 2, 0)],
        [task("F", 0, 1), task("F", 0, 2), task("F", 1, 1), task("F", 1, 2), task("BW", 0, 2), task("BW", 0, 1),
         task("F", 2, 1), task("F", 2, 2), task("B", 1, 2), task("B", 1, 1), task("W", 1, 2), task("BW", 2, 2),
         task("BW", 2, 1), task("W", 1, 1)]]}


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory) -> dict:
    """Export zb-h2 and the hand-written file with the command line, then run both CSV
    files on torch's runtime in one launch; {name: (csv text, TorchRuntimeResult)}."""
    tmp = tmp_path_factory.mktemp("torch_runtime")
    hand = tmp / "hand-v3.json"
    hand.write_text(json.dumps(HAND_V))
    sources = {"zb-h2": ["zb-h2", "-p", "2", "-m", "4"], "hand-v3": [str(hand)]}
    paths = []
    for name, args in sources.items():
        path = tmp / f"{name}.csv"
        assert main(["export-torch", *args, "-o", str(path), "--check"]) == 0
        paths.append(path)
    results = torch_runtime.run_on_torch_runtime(paths, MLP64, timeout=60)
    return {r.name: (p.read_text(), r) for p, r in zip(paths, results)}


@pytest.mark.distributed
@pytest.mark.parametrize("name,microbatches,stages", [("zb-h2", 4, 2), ("hand-v3", 3, 4)])
def test_torch_runtime_runs_our_export_exactly(torch_runs, name, microbatches, stages):
    text, result = torch_runs[name]
    assert "I" in text and "W" in text  # split backwards reach torch as I and W actions
    if name == "hand-v3":
        assert "(3F2;0B0)OVERLAP_F_B" in text or not torch_runtime.supports_overlap()
    assert (result.microbatches, result.num_stages) == (microbatches, stages)
    assert sorted(result.grads) == list(range(stages))
    assert all(g is not None and g.abs().max() > 0 for gs in result.grads.values() for g in gs)
    check = result.check(MLP64)
    assert check.tolerance == 1e-6  # float64
    assert check.grads_match and check.loss_matches, check.to_dict()


def test_export_splits_pairs_and_refuses_what_torch_cannot_run():
    schedule = fileformat.loads(json.dumps(HAND_V))
    paired, split = torch_format.to_rows(schedule), torch_format.to_rows(schedule, overlap=False)
    assert "(3F2;0B0)OVERLAP_F_B" in paired[0] and not any("OVERLAP" in c for row in split for c in row)
    assert split[0][7:9] == ["3F2", "0B0"] and split[1] == paired[1]
    with pytest.raises(ScheduleError, match="more than one rank"):
        torch_format.to_rows(build("dualpipe", 2, 4))
    # torch hands the backward of microbatch i the i-th loss its last stage computed
    late = json.loads(json.dumps(HAND_V))
    program = late["programs"][0]
    program[2], program[5] = program[5], program[2]  # F1@3 before F0@3
    with pytest.raises(ScheduleError, match=r"out of microbatch order \(F1 before F0\)"):
        torch_format.to_rows(fileformat.loads(json.dumps(late)))


def test_runtime_refuses_a_csv_before_starting_processes(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F1,1F0,1B1,1B0\n")  # torch would backpropagate mb 0's loss for mb 1
    with pytest.raises(ScheduleError, match="out of microbatch order"):
        torch_runtime.run_on_torch_runtime([path], MLP64)


def test_every_exportable_builtin_loads_in_torch():
    # torch's _load_csv validates, maps stages to ranks and lowers to sends/receives
    loaded = 0
    for name in BUILDERS:
        if name == "dualpipe":  # two replicas of each model stage: refused above
            continue
        for p in (2, 4):
            for m in (1, p, 2 * p + 1):
                schedule = build(name, p, m)
                for overlap in (True, False):
                    rows = torch_format.to_rows(schedule, overlap)
                    torch_runtime.check_loads(torch_runtime.case_from_rows(rows, name))
                    loaded += 1
    assert loaded == (len(BUILDERS) - 1) * 2 * 3 * 2


def test_torch_refusal_is_one_line():
    # torch's own validation (B before F) reaches us as its first line only
    case = torch_runtime.case_from_rows([["0B0", "0F0"], ["1F0", "1B0"]], "backwards")
    with pytest.raises(ScheduleError, match="refuses backwards") as info:
        torch_runtime.check_loads(case)
    assert "\n" not in str(info.value) and torch.__version__ in str(info.value)


def missing_runtime(monkeypatch) -> None:
    monkeypatch.delattr(torch_schedules, "_PipelineScheduleRuntime")


def missing_load_csv(monkeypatch) -> None:
    # the runtime overrides PipelineScheduleMulti's _load_csv; both must go
    monkeypatch.delattr(torch_schedules._PipelineScheduleRuntime, "_load_csv")
    monkeypatch.delattr(torch_schedules.PipelineScheduleMulti, "_load_csv")


@pytest.mark.parametrize("remove,missing", [(missing_runtime, "schedules._PipelineScheduleRuntime"),
                                            (missing_load_csv, "_PipelineScheduleRuntime._load_csv")])
def test_missing_private_runtime_is_one_line(monkeypatch, capsys, remove, missing):
    remove(monkeypatch)
    with pytest.raises(ScheduleError) as info:
        torch_runtime.run_on_torch_runtime([build("zb-h2", 2, 4)], MLP64)
    message = str(info.value)
    assert missing in message and f"torch {torch.__version__} lacks" in message and "\n" not in message
    code, out, err = cli(capsys, "export-torch", "zb-h2", "-p", "2", "-m", "4", "--check")
    assert code == 2 and missing in err and err.count("\n") == 1 and not out
    code, out, _ = cli(capsys, "export-torch", "zb-h2", "-p", "2", "-m", "4")  # needs no torch
    assert code == 0 and out.startswith("0F0,")


def test_torch_without_overlap_asks_for_no_overlap(monkeypatch, capsys):
    monkeypatch.setattr(torch_runtime, "supports_overlap", lambda: False)
    code, _, err = cli(capsys, "export-torch", "dualpipev", "-p", "2", "-m", "4", "--check")
    assert code == 2 and "--no-overlap" in err and err.count("\n") == 1
    code, out, _ = cli(capsys, "export-torch", "dualpipev", "-p", "2", "-m", "4", "--check", "--no-overlap")
    assert code == 0 and "OVERLAP" not in out
    # the runtime helper splits pairs by itself on such a torch
    assert "OVERLAP" not in torch_runtime.prepare(fileformat.loads(json.dumps(HAND_V))).text
