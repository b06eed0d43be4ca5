"""Stochastic mode: the makespan distribution when op and transfer times vary.

Each run multiplies every op and transfer time by an independent lognormal factor with
mean 1 and the given coefficient of variation, so stragglers appear at random places;
what a straggler-prone cluster sees is the makespan's mean and upper percentiles.
A data-parallel step's tail (simulator.data_parallel) is added to each run, unjittered.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from pipesched.schedules.graph import TaskGraph

from .costs import CostModel
from .data_parallel import add_step_tail, has_tail
from .des import run_des
from .exact import longest_path
from .timing import resolve, to_trace
from .trace import ALLREDUCE, COMPUTE


@dataclass
class MakespanStats:
    runs: int
    cv: float
    seed: int
    mean: float
    std: float
    p50: float
    p95: float
    min: float
    max: float

    def to_dict(self) -> dict:
        return asdict(self)


def sample_makespans(graph: TaskGraph, costs: CostModel, runs: int, cv: float, seed: int = 0,
                     engine: str = "exact", progress: Callable[[int, str], None] | None = None) -> np.ndarray:
    """Makespans (seconds) of `runs` independent noisy runs. Both engines give the same
    timeline for the same draws; "exact" is the faster, and shared compute always runs
    the DES. `progress(done, what)` is called before each run and once at the end."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if not (cv >= 0 and math.isfinite(cv)):
        raise ValueError(f"cv must be finite and >= 0, got {cv}")
    rng = np.random.default_rng(seed)
    out = np.empty(runs)
    for i in range(runs):
        if progress:
            progress(i, f"run {i + 1}")
        timing = resolve(graph, costs, noise_cv=cv, rng=rng)
        timeline = longest_path(graph, timing) if engine == "exact" and costs.host is None \
            else run_des(graph, timing, costs.host)
        out[i] = max(timeline.unit_end)
        if has_tail(timing.stage_costs, costs.data_parallel):
            trace = add_step_tail(to_trace(graph, timing, timeline), graph.schedule, timing.stage_costs,
                                  costs.data_parallel)
            out[i] = float(trace.end[(trace.lane == COMPUTE) | (trace.lane == ALLREDUCE)].max())
    if progress:
        progress(runs, "done")
    return out


def makespan_stats(graph: TaskGraph, costs: CostModel, runs: int, cv: float, seed: int = 0,
                   engine: str = "exact", progress: Callable[[int, str], None] | None = None) -> MakespanStats:
    x = sample_makespans(graph, costs, runs, cv, seed, engine, progress)
    return MakespanStats(runs, cv, seed, float(x.mean()), float(x.std()), float(np.percentile(x, 50)),
                         float(np.percentile(x, 95)), float(x.min()), float(x.max()))
