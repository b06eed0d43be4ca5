"""Calibration: measure the cost model of a model on this machine.

`calibrate` launches the ranks (or runs this one under torchrun) and runs the collective
its options choose: solo profiles of every op, link and shared host
(`executor.solo_calibration.calibrate_here`), then, where runs predict better (CPUs by
default, `CalibrationOptions.from_runs`), op and host times read from short pipeline
runs (`executor.run_calibration.calibrate_with_runs`). Rank 0 gets a
`simulator.costs.CostModel`. Units: seconds and bytes.
"""
from __future__ import annotations

from pipesched.schedules.ir import Schedule
from pipesched.simulator.costs import CostModel

from .launch import launch_local, run_here, under_torchrun
from .models import ExampleModel, PipelineModel
from .run_calibration import calibrate_with_runs
from .solo_calibration import (PINGPONG_SIZES, CalibrationOptions, calibrate_here, core_groups, directed_links,
                               host_sharing, links_of, oversubscribed, side_by_side_groups)

__all__ = ["calibrate", "calibration_job", "CalibrationOptions", "calibrate_here", "calibrate_with_runs",
           "PINGPONG_SIZES", "core_groups", "directed_links", "host_sharing", "links_of", "oversubscribed",
           "side_by_side_groups"]


def calibration_job(options: CalibrationOptions):
    """The collective that calibrates as `options` say: `calibrate_with_runs` (which
    uses the runs where `run_calibration.uses_runs` says so), or `calibrate_here` with
    from_runs False."""
    return calibrate_here if options.from_runs is False else calibrate_with_runs


def calibrate(schedule: Schedule, model: PipelineModel | ExampleModel,
              options: CalibrationOptions = CalibrationOptions(), backend: str = "gloo") -> CostModel | None:
    """Launch the ranks (or run this one under torchrun) and calibrate; the cost model on
    rank 0 (and locally), None on other torchrun ranks."""
    options.check()
    job = calibration_job(options)
    if under_torchrun():
        return run_here(job, (schedule, model, options), backend, options.timeout)
    return launch_local(job, (schedule, model, options), schedule.ranks, backend, options.timeout)
