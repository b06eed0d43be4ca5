"""Stage switches: an op right after another stage's op on its rank runs longer."""
from __future__ import annotations

import pytest

from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, CostModel, StageCost, StageSwitch
from pipesched.simulator.cost_file import from_dict, to_dict
from pipesched.simulator.metrics import compute_metrics

PLAIN = CostModel(stages=(StageCost(1.0, 1.0, 1.0),))
SWITCH = StageSwitch(forward=0.5, backward=0.25)


def makespan(name: str, p: int, m: int, costs: CostModel) -> float:
    return compute_metrics(simulate(build(name, p, m), costs)).makespan


def test_a_switch_lengthens_the_op_after_it_by_its_fraction():
    # looped BFS, one rank, two model stages of half the rank's costs each (F 0.5 s, BW 1 s):
    # F F F F BW BW BW BW on stages 0 0 1 1 1 1 0 0; the third F and the seventh op follow
    # another stage: 6 + 0.5 x 0.5 + 0.25 x 1
    assert makespan("looped-bfs", 1, 2, PLAIN) == pytest.approx(6.0)
    assert makespan("looped-bfs", 1, 2, CostModel(stages=PLAIN.stages, stage_switch=SWITCH)) == pytest.approx(6.5)


def test_how_much_longer_each_op_kind_and_model_stage_runs_on_average():
    from pipesched.schedules.validate import validate
    from pipesched.simulator.switches import switch_factors

    # the same program as above: F of stage 1 and BW of stage 0 each follow the other stage
    # once in two, and the other one of each is the second of its stage after that switch
    second = StageSwitch(forward=0.5, backward=0.25, forward_second=0.2, backward_second=0.1)
    assert switch_factors(validate(build("looped-bfs", 1, 2)), second) == pytest.approx({
        ("F", 0): 1.0, ("F", 1): 1.0 + (0.5 + 0.2) / 2, ("BW", 1): 1.0, ("BW", 0): 1.0 + (0.25 + 0.1) / 2})


def test_the_op_after_a_switched_one_runs_longer_by_its_own_fraction():
    # the program above: the fourth F (0.5 s) and the last BW (1 s) come second after a switch
    second = StageSwitch(forward=0.5, backward=0.25, forward_second=0.2, backward_second=0.1)
    assert makespan("looped-bfs", 1, 2, CostModel(stages=PLAIN.stages, stage_switch=second)) == pytest.approx(
        6.5 + 0.2 * 0.5 + 0.1 * 1.0)
    only_second = StageSwitch(forward_second=0.2)
    assert only_second.any
    assert makespan("looped-bfs", 1, 2, CostModel(stages=PLAIN.stages, stage_switch=only_second)) == pytest.approx(
        6.0 + 0.2 * 0.5)


def test_one_stage_per_rank_never_switches():
    switching = CostModel(stages=PLAIN.stages, stage_switch=SWITCH)
    for name in ("gpipe", "1f1b", "zb-h1"):
        assert makespan(name, 4, 8, switching) == makespan(name, 4, 8, PLAIN), name


def test_schedules_that_alternate_stages_slow_more_than_those_that_batch_them():
    switching = CostModel(stages=PLAIN.stages, stage_switch=SWITCH)
    slower = {name: makespan(name, 2, 8, switching) / makespan(name, 2, 8, PLAIN)
              for name in ("looped-bfs", "interleaved-1f1b", "dualpipe")}
    assert 1.0 < slower["looped-bfs"] < slower["interleaved-1f1b"]
    assert slower["dualpipe"] > slower["looped-bfs"]


def test_the_cost_file_keeps_the_switch_and_refuses_bad_values():
    doc = to_dict(CostModel(stages=PLAIN.stages, stage_switch=SWITCH))
    assert doc["stage_switch"] == {"forward": 0.5, "backward": 0.25}
    assert from_dict(doc).stage_switch == SWITCH
    assert "stage_switch" not in to_dict(PLAIN)  # files without a switch stay as they were
    second = StageSwitch(forward=0.5, backward=0.25, forward_second=0.125, backward_second=0.0625)
    doc2 = to_dict(CostModel(stages=PLAIN.stages, stage_switch=second))
    assert doc2["stage_switch"] == {"forward": 0.5, "backward": 0.25, "forward_second": 0.125,
                                    "backward_second": 0.0625}
    assert from_dict(doc2).stage_switch == second
    for bad, says in (({"forward": -0.1}, "stage_switch.forward must be a finite fraction >= 0"),
                      ({"forward": "20%"}, "stage_switch.forward must be a finite fraction"),
                      ({"sideways": 0.1}, "stage_switch must be an object with backward, backward_second, "
                                          "forward, forward_second"),
                      ([0.1], "stage_switch must be an object")):
        with pytest.raises(CostError, match=says):
            from_dict({**doc, "stage_switch": bad})


def test_a_calibration_cut_for_v2_keeps_its_fixed_times_and_adds_no_switch():
    calibrated = CostModel(model_stages=(StageCost(2.0, 1.0, 1.0), StageCost(2.0, 1.0, 1.0)))
    switching = CostModel(model_stages=calibrated.model_stages, stage_switch=SWITCH)
    assert makespan("interleaved-1f1b", 2, 8, switching) == makespan("interleaved-1f1b", 2, 8, calibrated)
    assert makespan("dualpipe", 2, 8, switching) > makespan("dualpipe", 2, 8, calibrated)


def test_the_cost_table_says_how_much_longer_a_switched_op_runs(capsys):
    from pipesched.tables import print_costs

    print_costs(CostModel(stages=PLAIN.stages, stage_switch=StageSwitch(forward=0.054, backward=0.018,
                                                                        forward_second=0.031)))
    assert ("runs longer (at the calibrated split: DualPipe's replicas): F 5.4 %, backward 1.8 %; "
            "the op after it, of the same stage: F 3.1 %, backward 0.0 %") in capsys.readouterr().out
