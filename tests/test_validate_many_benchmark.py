"""benchmarks/validate_many.py: the loss of a user who follows the command's pick and advice."""
from __future__ import annotations

import pytest

from helpers import benchmark_module

bench = benchmark_module("validate_many")


def doc(measured: dict[str, float], pick: str, settled: bool, to_measure: tuple[str, ...]) -> dict:
    fastest = min(measured, key=measured.__getitem__)
    return {"schedules": [{"schedule": n, "measured": {"makespan": t}} for n, t in measured.items()],
            "ranking": {"predicted_fastest": pick, "measured_fastest": fastest, "by": "makespan",
                        "pick_over_fastest": measured[pick] / measured[fastest] - 1,
                        "confidence": {"settled": settled, "to_measure": list(to_measure)}}}


def test_a_settled_pick_costs_what_it_measured():
    assert bench.advised_loss(doc({"a": 1.2, "b": 1.0}, "a", True, ("a",))) == (True, pytest.approx(0.2))


def test_an_unsettled_pick_costs_the_best_of_the_schedules_it_named():
    # named a and b: the user measures both and keeps b, 5 % over the fastest (c)
    got = bench.advised_loss(doc({"a": 1.2, "b": 1.05, "c": 1.0}, "a", False, ("a", "b")))
    assert got == (False, pytest.approx(0.05))
    # named the fastest: no loss
    assert bench.advised_loss(doc({"a": 1.2, "c": 1.0}, "a", False, ("a", "c")))[1] == pytest.approx(0.0)


def test_without_a_confidence_the_pick_stands():
    d = doc({"a": 1.1, "b": 1.0}, "a", True, ("a",))
    d["ranking"]["confidence"] = None
    assert bench.advised_loss(d) == (True, pytest.approx(0.1))


def test_kept_folders_are_ranked_again_and_summarized(tmp_path, capsys):
    from dataclasses import replace

    from pipesched.schedules.registry import build
    from pipesched.simulator.api import simulate
    from pipesched.simulator.cost_file import save
    from pipesched.simulator.costs import CostModel, StageCost

    costs = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
    for name, slower in (("1f1b", 1.2), ("zb-h1", 1.0)):  # 1F1B predicted 1.2x as long as it measured
        folder = tmp_path / "p2-model0" / name
        folder.mkdir(parents=True)
        predicted = simulate(build(name, 2, 4), costs)
        held = float(predicted.end.max()) / slower
        predicted.save(folder / "predicted.json")
        replace(predicted, source="measured", start=predicted.start / slower, end=predicted.end / slower,
                meta={**predicted.meta, "makespans": [held] * 3, "model_stages": 2}).save(folder / "measured.json")
        save(costs, folder / "costs.json")
    doc = bench.kept_doc(tmp_path / "p2-model0")
    errors = {s["schedule"]: s["makespan_rel_error"] for s in doc["schedules"]}
    assert errors == pytest.approx({"1f1b": 0.2, "zb-h1": 0.0})
    made = {s["schedule"]: s["measured"]["makespan"] for s in doc["schedules"]}
    # predicted: ZB-H1 first; measured: 1F1B, whose prediction was 20 % long
    assert doc["ranking"]["predicted_fastest"] == "zb-h1" and doc["ranking"]["measured_fastest"] == "1f1b"
    assert doc["ranking"]["pick_over_fastest"] == pytest.approx(made["zb-h1"] / made["1f1b"] - 1)
    assert bench.rerank([tmp_path]) == 0 and "fastest right 0/1" in capsys.readouterr().out
    assert bench.rerank([tmp_path / "p2-model0"]) == 2
