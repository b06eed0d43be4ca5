"""How sure a predicted pick is: the predicted lead against the error known per schedule."""
import pytest

from pipesched.simulator.confidence import KNOWN_ERROR, known_error, pick_confidence


def test_a_lead_larger_than_both_known_errors_settles_the_pick():
    sure = pick_confidence({"zb-h1": 1.0, "1f1b": 1.10, "gpipe": 1.30})
    assert (sure.pick, sure.runner_up) == ("zb-h1", "1f1b")
    assert sure.gap == pytest.approx(0.10) and sure.error == pytest.approx(0.028)
    assert sure.settled and sure.to_measure == ("zb-h1",)


def test_a_lead_within_the_known_error_names_the_schedules_to_measure():
    # ZB-V is known to miss by up to 6.9 % on its own cores, DualPipe by 8.4 %
    sure = pick_confidence({"zb-v": 1.0, "dualpipe": 1.05, "zb-h1": 1.08, "gpipe": 1.5})
    assert not sure.settled and sure.error == pytest.approx(0.084)
    assert sure.to_measure == ("zb-v", "dualpipe")  # ZB-H1, 8 % behind, is beyond ZB-V's 6.9 %
    assert pick_confidence({"zb-v": 1.0, "zb-h1": 1.08}).settled


def test_ranks_sharing_cores_widen_the_error():
    assert known_error("interleaved-1f1b", shared_cores=True) > known_error("interleaved-1f1b", shared_cores=False)
    predicted = {"1f1b": 1.0, "interleaved-1f1b": 1.10}
    assert pick_confidence(predicted).settled and not pick_confidence(predicted, shared_cores=True).settled


def test_an_unknown_schedule_gets_the_largest_two_chunk_error():
    assert known_error("v-half", False) == max(KNOWN_ERROR[s][0] for s in ("interleaved-1f1b", "zb-v", "dualpipev"))


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        pick_confidence({})
    with pytest.raises(ValueError):
        pick_confidence({"1f1b": 0.0, "zb-h1": 1.0})
    assert pick_confidence({"1f1b": 2.0}).settled


def test_a_launchs_own_floor_raises_every_error():
    # two runs of one schedule in the launch were 9 % apart: a 5 % lead no longer settles it
    predicted = {"zb-h1": 1.0, "1f1b": 1.05, "gpipe": 1.30}
    assert pick_confidence(predicted).settled
    sure = pick_confidence(predicted, floor=0.09)
    assert not sure.settled and sure.error == pytest.approx(0.09) and sure.to_measure == ("zb-h1", "1f1b")
    assert sure.to_dict()["floor"] == 0.09 and sure.by_floor
    assert pick_confidence(predicted).to_dict()["floor"] == 0.0 and not pick_confidence(predicted).by_floor
    assert not pick_confidence(predicted, floor=0.01).by_floor  # under the known 2.8 %: the record decides
    for bad in (-0.01, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="floor must be a finite fraction"):
            pick_confidence(predicted, floor=bad)


def test_the_line_names_the_launchs_floor_where_it_decides():
    from pipesched.commands.validate_many import confidence_line

    def line(floor: float) -> str:
        return confidence_line({"confidence": pick_confidence({"dualpipe": 1.0, "1f1b": 1.09}, False, floor).to_dict(),
                                "shared_cores": False})

    assert line(0.0).endswith("known to miss by up to 8.4 % (75th percentile, CPUs, a core per rank): "
                              "the prediction settles it")
    assert "two runs of one schedule in this launch were 11.2 % apart" in line(0.112)
    assert line(0.112).endswith("not settled by the prediction; measure dualpipe, 1f1b")
