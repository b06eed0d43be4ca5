"""pipesched: choose, predict and run pipeline-parallel training schedules.

    import pipesched as ps

    costs = ps.uniform_costs(f=12e-3, b=14e-3, w=10e-3, activation_bytes=128 * 2**20, bandwidth=50e9)
    schedule = ps.build("zb-v", ranks=8, microbatches=32, costs=costs)
    trace = ps.simulate(schedule, costs)
    print(ps.metrics(trace, schedule).makespan)   # seconds
    ps.plot(trace, "zb-v.png")

Schedules and the simulator need neither torch nor matplotlib: `run`, `calibrate` and
`validate` import the executor (the `torch` extra) and `plot` imports matplotlib only
when called. Every public name is loaded when first used, so `import pipesched` (or
`import pipesched.schedules.ir`) loads none of simpy, matplotlib and torch. Units
everywhere: seconds, bytes, bytes per second.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .executor.calibrate import CalibrationOptions
    from .executor.job import RunOptions, RunResult
    from .executor.models import ExampleModel, PipelineModel
    from .executor.validation import Validation
    from .schedules.graph import TaskGraph
    from .schedules.ir import Overlap, Schedule, ScheduleError, Task, VirtualStage
    from .simulator.api import simulate
    from .simulator.budget import BudgetError
    from .simulator.compare import Comparison, compare
    from .simulator.costs import CostError, CostModel, DataParallel, StageCost
    from .simulator.metrics import Metrics
    from .simulator.planner import Candidate, Plan, plan
    from .simulator.replay import ReplayError, replay
    from .simulator.sweep import SweepRow, sweep
    from .simulator.trace import Trace, TraceError

__version__ = "0.1.0"

__all__ = [
    # schedules
    "Schedule", "Task", "Overlap", "VirtualStage", "TaskGraph", "ScheduleError",
    "build", "schedule_names", "check_schedule", "load_schedule", "save_schedule",
    # costs and the simulator
    "CostModel", "StageCost", "DataParallel", "CostError", "uniform_costs", "load_costs", "save_costs",
    "estimate_costs",
    "simulate", "Trace", "TraceError", "Metrics", "metrics", "Comparison", "compare", "plot",
    "replay", "ReplayError",
    # choosing a schedule
    "plan", "Plan", "Candidate", "sweep", "SweepRow", "BudgetError",
    # the executor (torch)
    "PipelineModel", "ExampleModel", "RunOptions", "RunResult", "CalibrationOptions", "Validation",
    "run", "calibrate", "validate", "validate_many",
]

_LAZY = {  # public name -> the module it comes from, imported when the name is first used
    **dict.fromkeys(("Schedule", "Task", "Overlap", "VirtualStage", "ScheduleError"), "pipesched.schedules.ir"),
    "TaskGraph": "pipesched.schedules.graph",
    **dict.fromkeys(("CostModel", "StageCost", "DataParallel", "CostError"), "pipesched.simulator.costs"),
    "simulate": "pipesched.simulator.api",
    **dict.fromkeys(("Trace", "TraceError"), "pipesched.simulator.trace"),
    "Metrics": "pipesched.simulator.metrics",
    **dict.fromkeys(("Comparison", "compare"), "pipesched.simulator.compare"),
    **dict.fromkeys(("replay", "ReplayError"), "pipesched.simulator.replay"),
    **dict.fromkeys(("plan", "Plan", "Candidate"), "pipesched.simulator.planner"),
    **dict.fromkeys(("sweep", "SweepRow"), "pipesched.simulator.sweep"),
    "BudgetError": "pipesched.simulator.budget",
    **dict.fromkeys(("PipelineModel", "ExampleModel"), "pipesched.executor.models"),
    **dict.fromkeys(("RunOptions", "RunResult"), "pipesched.executor.job"),
    "CalibrationOptions": "pipesched.executor.calibrate",
    "Validation": "pipesched.executor.validation",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first used (PEP 562); the executor's
    types import torch then."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pipesched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def schedule_names() -> list[str]:
    """The built-in schedules' names, as `build` and the CLI take them."""
    from .schedules.registry import BUILDERS

    return list(BUILDERS)


def build(name: str, ranks: int, microbatches: int, chunks: int | None = None, *,
          costs: CostModel | None = None, max_activations: float | None = None,
          memory_limit: float | None = None, recompute: bool | Iterable[int] = False) -> Schedule:
    """A built-in schedule for `ranks` ranks and `microbatches` microbatches; `chunks` is v
    for schedules that take it. With `costs`, schedules that adapt to op durations
    (zb-h2, zb-v, v-half, v-min, zb-auto) order their ops for them, exactly as the command
    line does. `max_activations` (microbatches of one pipeline stage's activations; 1F1B
    holds p) and `memory_limit` (bytes per rank, under `costs`) bound zb-auto's search;
    any other schedule over them is refused (BudgetError, a ValueError). `recompute`: True recomputes
    every model stage's activations (an R op before each backward, see
    docs/recompute.md), an iterable of model stage indices only those; False (default)
    only the stages `costs` mark (`StageCost.recompute`)."""
    from .schedules.recompute import add_recompute
    from .schedules.registry import build as build_named
    from .simulator.budget import Budget, build_within, check_fits
    from .simulator.costs import CostModel

    budget = Budget(max_activations, memory_limit)
    if recompute is not True and recompute is not False:  # some model stages: built, then transformed
        schedule = add_recompute(build(name, ranks, microbatches, chunks, costs=costs), recompute)
        check_fits(schedule, costs, budget)
        return schedule
    if costs is None and not budget:
        return add_recompute(build_named(name, ranks, microbatches, chunks), recompute)
    costs = CostModel() if costs is None else costs.check()
    return build_within(name, ranks, microbatches, chunks, costs, budget, recompute=recompute)


def check_schedule(schedule: Schedule) -> TaskGraph:
    """Validate any schedule (placement, completeness, no deadlock) and compile its task
    graph; ScheduleError names the first problem, a deadlock as ops per rank."""
    from .schedules.validate import validate as check

    return check(schedule)


def load_schedule(path: str | Path) -> Schedule:
    """A schedule file (`pipesched.schedule/1`, as `pipesched show --json` writes)."""
    from .schedules import fileformat

    return fileformat.load(path)


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    """Write `schedule` as a `pipesched.schedule/1` file."""
    from .schedules import fileformat

    fileformat.save(schedule, path)


def uniform_costs(f: float = 1.0, b: float = 1.0, w: float = 1.0, **fields: Any) -> CostModel:
    """Every pipeline stage takes F, B, W seconds per microbatch; keywords: latency (s),
    bandwidth (bytes/s), activation_bytes, activation_memory, weight_memory, param_bytes
    (bytes) and any other CostModel field."""
    from .simulator.costs import uniform

    return uniform(f, b, w, **fields)


def load_costs(path: str | Path) -> CostModel:
    """A cost file (`pipesched.costs/1`, JSON or TOML, as `pipesched calibrate` writes)."""
    from .simulator import cost_file

    return cost_file.load(path)


def save_costs(costs: CostModel, path: str | Path) -> None:
    """Write `costs` as a `pipesched.costs/1` JSON file."""
    from .simulator import cost_file

    cost_file.save(costs, path)


def estimate_costs(model: str | Path | dict, gpu: str | Path = "h100-sxm", **setup: Any) -> CostModel:
    """Costs of a cluster you do not have (docs/cluster.md): `model` is a preset name
    (`llama3-70b`, `gpt3-175b`, ...), a Hugging Face config.json or its dict; `gpu` a GPU
    kind (`a100-80gb`, `h100-sxm`, `h200`) or a hardware file; `setup` the keywords of
    `pipesched.simulator.estimate.Setup` (seq, microbatch_size, dtype, tp, sp, recompute,
    dp, zero, ...). A CostModel stating the model layer by layer, per GPU."""
    from .simulator.estimate import Setup, estimate
    from .simulator.hardware import GPU_KINDS, hardware, load_hardware
    from .simulator.model_config import PRESETS, from_hf_dict, load_hf_config, preset

    if isinstance(model, dict):
        config = from_hf_dict(model)
    else:
        config = preset(str(model)) if str(model).lower() in PRESETS else load_hf_config(model)
    hw = hardware(str(gpu)) if str(gpu).lower() in GPU_KINDS else load_hardware(gpu)
    return estimate(config, Setup(**setup), hw).cost_model()


def metrics(trace: Trace, schedule: Schedule | TaskGraph | None = None) -> Metrics:
    """Makespan, bubble ratio, per-rank busy/idle/peak memory and communication overlap of
    any trace, simulated or measured; with the trace's schedule, the critical path too."""
    from .schedules.ir import Schedule
    from .schedules.validate import validate as check
    from .simulator.metrics import compute_metrics

    graph = check(schedule) if isinstance(schedule, Schedule) else schedule
    return compute_metrics(trace, graph)


def plot(trace: Trace, path: str | Path | None = None, *, vs: Trace | None = None, memory: bool = True,
         title: str | None = None, window: tuple[float, float] | None = None,
         figsize: tuple[float, float] | None = None) -> "Figure":
    """The timeline of `trace` (or `trace` against `vs`, e.g. predicted against measured),
    written to `path` (.png, .svg, .pdf) when given. `window`: (start, end) seconds to
    draw; `figsize`: (width, height) inches."""
    from .plots.compare import plot_compare
    from .plots.timeline import plot_timeline

    if vs is None:
        return plot_timeline(trace, path, memory=memory, title=title, window=window, figsize=figsize)
    return plot_compare(trace, vs, path, memory=memory, title=title, window=window, figsize=figsize)


def run(schedule: Schedule, model: "PipelineModel | ExampleModel", options: "RunOptions | None" = None,
        backend: str = "gloo") -> "RunResult | None":
    """Run `schedule` on `model` with one local process per rank (torch.distributed P2P),
    or this process's rank under torchrun; the measured trace, step times and the check
    against the unpipelined model come back on rank 0 (None on other torchrun ranks).
    `RunOptions(dp=D)` runs D data-parallel replicas (p x D processes; `model` then holds
    the batch of D x m microbatches, see docs/data_parallel.md).
    Call it under `if __name__ == "__main__":` (ranks are started with spawn)."""
    from .executor.job import RunOptions, launch

    return launch(schedule, model, options or RunOptions(), backend)


def calibrate(schedule: Schedule, model: "PipelineModel | ExampleModel",
              options: "CalibrationOptions | None" = None, backend: str = "gloo", *, dp: int = 1,
              bucket_bytes: float | None = None) -> "CostModel | None":
    """Measure `model`'s op, transfer and host costs on this machine, placed as `schedule`
    places them: a CostModel for `simulate` (None on torchrun ranks other than 0). With
    `dp` > 1 (local launches only) also the data-parallel step's costs on p x dp ranks
    (see docs/data_parallel.md); `model` then holds dp x m microbatches."""
    from .executor.calibrate import CalibrationOptions, calibrate as _calibrate
    from .executor.job import prepare

    prepare(schedule, model, backend, dp)
    if dp > 1:
        from .executor.dp_calibrate import calibrate_data_parallel
        return calibrate_data_parallel(schedule, model, dp, options or CalibrationOptions(), backend, bucket_bytes)[0]
    return _calibrate(schedule, model, options or CalibrationOptions(), backend)


def validate(schedule: Schedule, model: "PipelineModel | ExampleModel", options: "RunOptions | None" = None,
             calibration: "CalibrationOptions | None" = None, backend: str = "gloo") -> "Validation | None":
    """Calibrate, simulate, run and compare: the prediction's error against the measured
    run (makespan, bubbles, op starts, peak memory per rank)."""
    from .executor.calibrate import CalibrationOptions
    from .executor.job import RunOptions, prepare
    from .executor.validation import validate_schedule

    options = options or RunOptions()
    prepare(schedule, model, backend, options.dp)
    return validate_schedule(schedule, model, options or RunOptions(), calibration or CalibrationOptions(), backend)


def validate_many(schedules: "list[Schedule]", model: "PipelineModel | ExampleModel",
                  options: "RunOptions | None" = None, calibration: "CalibrationOptions | None" = None,
                  backend: str = "gloo") -> "list[Validation]":
    """Which of several schedules (same ranks) wins on one network: one calibration
    predicts them all, their runs take their steps in turn in one local launch, and each
    is compared with its prediction. `model` is the network as split for the first
    schedule; an example model is split for the others (v = 2 schedules: half the blocks
    per model stage). No data parallelism, not under torchrun."""
    from .executor.calibrate import CalibrationOptions
    from .executor.job import RunOptions, prepare
    from .executor.validation import network_for, validate_schedules

    options = options or RunOptions()
    for schedule in schedules:
        prepare(schedule, network_for(model, schedules[0], schedule), backend, options.dp)
    return validate_schedules(list(schedules), model, options, calibration or CalibrationOptions(), backend)
