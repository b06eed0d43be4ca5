"""What `validate` warns about: ops too short for the runtime, noisy steps, calibration
samples that disagree."""
from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from pipesched.executor.validation import median_uncertainty, too_short, warnings_for  # noqa: E402
from pipesched.simulator.run_costs import relative_iqr  # noqa: E402
from pipesched.simulator.costs import CostModel, HostOverhead, StageCost  # noqa: E402
from pipesched.simulator.run_costs import halves_apart  # noqa: E402

LONG = CostModel(stages=(StageCost(4e-3, 4e-3, 4e-3),), host_overhead=HostOverhead(per_op=1e-4, per_take=1e-4))


def test_quiet_runs_of_long_ops_give_no_warning():
    assert warnings_for(LONG, [0.100, 0.101, 0.099, 0.100, 0.102]) == []


def test_ops_within_five_times_the_runtime_time_per_op_are_too_short():
    short = replace(LONG, stages=(StageCost(0.9e-3, 0.3e-3, 0.3e-3),))  # F 0.9 ms < 5 x 0.2 ms
    assert too_short(short) and not too_short(LONG)
    (warning,) = warnings_for(short, [])
    assert warning.startswith("the shortest op takes 0.6 ms, within 3.0x")  # BW = B + W


def test_one_slow_step_does_not_make_the_steps_noisy_but_a_wide_middle_half_does():
    assert warnings_for(LONG, [0.100, 0.101, 0.100, 0.102, 0.400]) == []  # an outlier, middle half 1 %
    (warning,) = warnings_for(LONG, [0.100, 0.110, 0.120, 0.130, 0.140])  # IQR 20 ms over median 120 ms
    assert "spans 16.7 % of their median" in warning
    # the median of the 5 steps: 1.2533 x 0.1667 / 1.349 / sqrt(5) = 6.9 %, and 20 steps halve it
    assert "uncertain by about 6.9 %" in warning and "20 steps (--steps) would halve that" in warning


def test_the_median_uncertainty_is_the_spread_of_medians_of_that_many_steps():
    import numpy as np

    rng = np.random.default_rng(5)
    for n in (10, 40):
        runs = 1.0 + 0.1 * rng.standard_normal((4000, n))
        said = np.median([median_uncertainty(relative_iqr(r), n) for r in runs])
        assert said == pytest.approx(float(np.std(np.median(runs, axis=1))), rel=0.15)
    assert median_uncertainty(0.2, 40) == pytest.approx(median_uncertainty(0.2, 10) / 2)


def test_calibration_samples_that_disagree_are_reported():
    noisy = replace(LONG, meta={"calibrated": {"interference_samples": [0.05, 0.21]}})
    (warning,) = warnings_for(noisy, [])
    assert "as 5 % to 21 %" in warning


def test_the_measurement_against_itself_holds_even_steps_against_odd_ones():
    # every other step slow: the even steps' median 100 ms, the odd ones' 120 ms
    assert halves_apart([0.100, 0.120, 0.101, 0.119, 0.100, 0.121]) == pytest.approx(1 - 0.100 / 0.120)
    # a slow phase shared by both halves moves neither median apart
    assert halves_apart([0.100, 0.100, 0.150, 0.150, 0.100, 0.100]) == 0.0
    assert halves_apart([0.100]) is None and halves_apart([]) is None


def test_data_parallel_steps_are_held_against_their_mean():
    from pipesched.simulator.run_costs import typical_step
    steps = [0.30, 0.45, 0.30, 0.31, 0.46, 0.44]  # the all-reduce's two modes
    assert typical_step(steps) == pytest.approx(0.375) and typical_step(steps, 1) == pytest.approx(0.375)
    assert typical_step(steps, 2) == pytest.approx(sum(steps) / 6)
    # even steps 0.30, 0.30, 0.46 and odd 0.45, 0.31, 0.44: medians 0.30 and 0.44 apart, means much less
    assert halves_apart(steps) == pytest.approx(1 - 0.30 / 0.44)
    assert halves_apart(steps, 2) == pytest.approx(abs((1.06 / 3) / (1.20 / 3) - 1))
    with pytest.raises(ValueError):
        typical_step([])
