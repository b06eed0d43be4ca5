"""How sure a predicted pick is: the predicted lead against how far, and in which
direction, predictions of those schedules are known to miss."""
import pytest

from pipesched.schedules.registry import BUILDERS
from pipesched.simulator.confidence import KNOWN_ERROR, TWO_CHUNK, known_error, needed_lead, pick_confidence

# (low, high) with a core per rank, with two ranks a core
RECORD = {"1f1b": ((-0.02, 0.03), (-0.03, 0.04)), "zb-h1": ((-0.01, 0.04), (-0.02, 0.05)),
          "gpipe": ((-0.05, 0.06), (-0.05, 0.06)), "dualpipe": ((-0.05, 0.02), (-0.15, 0.01)),
          "zb-v": ((-0.03, 0.08), (-0.04, 0.09)), "interleaved-1f1b": ((-0.06, 0.05), (-0.10, 0.05)),
          "dualpipev": ((-0.07, 0.03), (-0.08, 0.04))}


def test_the_lead_needed_takes_the_pick_short_and_the_other_long():
    # ZB-H1 predicted as much as 1 % short, 1F1B 3 % long: ZB-H1 needs 1.03 / 0.99 - 1 = 4.04 %
    assert needed_lead("zb-h1", "1f1b", known=RECORD) == pytest.approx(1.03 / 0.99 - 1)
    sure = pick_confidence({"zb-h1": 1.0, "1f1b": 1.05, "gpipe": 1.30}, known=RECORD)
    assert (sure.pick, sure.runner_up) == ("zb-h1", "1f1b")
    assert sure.gap == pytest.approx(0.05) and sure.error == pytest.approx(1.03 / 0.99 - 1)
    assert sure.settled and sure.to_measure == ("zb-h1",)
    assert not pick_confidence({"zb-h1": 1.0, "1f1b": 1.04}, known=RECORD).settled


def test_a_schedule_known_to_be_predicted_short_needs_a_larger_lead_as_the_pick():
    # with two ranks a core DualPipe is predicted up to 15 % short and at most 1 % long
    as_pick = needed_lead("dualpipe", "1f1b", shared_cores=True, known=RECORD)
    as_other = needed_lead("1f1b", "dualpipe", shared_cores=True, known=RECORD)
    assert as_pick == pytest.approx(1.04 / 0.85 - 1) and as_other == pytest.approx(1.01 / 0.97 - 1)
    predicted = {"dualpipe": 1.0, "1f1b": 1.10}
    assert not pick_confidence(predicted, shared_cores=True, known=RECORD).settled
    assert pick_confidence({"1f1b": 1.0, "dualpipe": 1.10}, shared_cores=True, known=RECORD).settled
    assert pick_confidence(predicted, shared_cores=False, known=RECORD).settled  # 1.03 / 0.95: 8.4 %


def test_a_lead_within_the_needed_one_names_every_schedule_to_measure():
    sure = pick_confidence({"zb-v": 1.0, "dualpipe": 1.04, "zb-h1": 1.07, "gpipe": 1.5}, known=RECORD)
    assert not sure.settled and sure.error == pytest.approx(1.02 / 0.97 - 1)
    assert sure.to_measure == ("zb-v", "dualpipe", "zb-h1")  # ZB-H1 needs 1.04 / 0.97 - 1 = 7.2 %
    sure = pick_confidence({"zb-v": 1.0, "dualpipe": 1.04, "zb-h1": 1.073}, known=RECORD)
    assert sure.to_measure == ("zb-v", "dualpipe")


def test_an_unknown_schedule_gets_the_widest_two_chunk_range():
    low = min(RECORD[s][0][0] for s in TWO_CHUNK)
    high = max(RECORD[s][0][1] for s in TWO_CHUNK)
    assert known_error("v-half", False, RECORD) == (low, high) == (-0.07, 0.08)
    assert known_error("zb-v", True, RECORD) == (-0.04, 0.09)


def test_the_shipped_record_covers_every_built_in_schedule_with_low_below_high():
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev"):
        assert name in BUILDERS and name in KNOWN_ERROR
        for shared in (False, True):
            low, high = known_error(name, shared)
            assert -0.5 < low < high < 0.5
            assert needed_lead(name, name, shared) > 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        pick_confidence({})
    with pytest.raises(ValueError):
        pick_confidence({"1f1b": 0.0, "zb-h1": 1.0})
    assert pick_confidence({"1f1b": 2.0}).settled


def test_a_launchs_own_floor_raises_every_needed_lead():
    # two runs of one schedule in the launch were 9 % apart: a 5 % lead no longer settles it
    predicted = {"zb-h1": 1.0, "1f1b": 1.05, "gpipe": 1.30}
    assert pick_confidence(predicted, known=RECORD).settled
    sure = pick_confidence(predicted, floor=0.09, known=RECORD)
    assert not sure.settled and sure.error == pytest.approx(0.09) and sure.to_measure == ("zb-h1", "1f1b")
    assert sure.to_dict()["floor"] == 0.09 and sure.by_floor
    assert not pick_confidence(predicted, known=RECORD).by_floor
    assert not pick_confidence(predicted, floor=0.01, known=RECORD).by_floor  # under 4 %: the record decides
    for bad in (-0.01, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="floor must be a finite fraction"):
            pick_confidence(predicted, floor=bad)


def test_the_line_says_the_lead_needed_and_names_the_launchs_floor_where_it_decides():
    from pipesched.commands.validate_many import confidence_line

    def line(floor: float, again: dict | None = None) -> str:
        sure = pick_confidence({"dualpipe": 1.0, "1f1b": 1.09}, False, floor, known=RECORD)
        return confidence_line({"confidence": sure.to_dict(), "shared_cores": False, "measured_again": again or {}})

    assert line(0.0).startswith("how sure: dualpipe predicted 9.0 % ahead of 1f1b; it needs a lead of 8.4 %")
    assert line(0.0).endswith("(5th and 95th percentile of the error, CPUs, a core per rank): "
                              "the prediction settles it")
    assert "two runs of one schedule in this launch were 11.2 % apart" in line(0.112, {"1f1b": -0.112})
    assert "the two halves of one run's steps in this launch were 11.2 % apart" in line(0.112, {"1f1b": 0.02})
    assert line(0.112).endswith("not settled by the prediction; measure dualpipe, 1f1b")


def test_a_run_whose_step_halves_differ_is_a_floor_like_two_runs_of_one_schedule():
    from pipesched.commands.validate_many import ranking_of

    def summary(name: str, predicted: float, measured: float, halves: float, again: float | None = None) -> dict:
        return {"schedule": name, "predicted": {"makespan": predicted}, "measured": {"makespan": measured},
                "measured_halves_apart": halves, "calibration_run_apart": again}

    # DualPipe 9 % ahead needs 8.4 % over 1F1B (RECORD): settled while the runs repeat within 3 %
    runs = [summary("dualpipe", 1.0, 1.0, 0.02), summary("1f1b", 1.09, 1.1, 0.03, again=-0.01)]
    sure = ranking_of(runs, known=RECORD)["confidence"]
    assert sure["settled"] and sure["floor"] == pytest.approx(0.03)
    runs[0]["measured_halves_apart"] = 0.20  # the host swung by 20 % between even and odd steps
    ranking = ranking_of(runs, known=RECORD)
    assert ranking["measured_halves"] == {"dualpipe": 0.20, "1f1b": 0.03}
    assert ranking["confidence"]["floor"] == pytest.approx(0.20) and not ranking["confidence"]["settled"]
    assert ranking["confidence"]["to_measure"] == ["dualpipe", "1f1b"]
