"""Activation memory of a schedule counted in microbatches, from its programs alone.

Unit: one microbatch's activations of one pipeline stage (1/p of the model), so 1F1B's
first rank holds p. A chunk of a schedule with S model stages counts p/S of that (1/v
for v chunks per rank). An activation is held from its forward until the op that
frees it: the W of a split backward (the weight gradient still reads the inputs) or a
fused BW. The order of a rank's program fixes this count, so no timing is needed; the
simulator's bytes (simulator.memory) free part of it at B when weight_memory is smaller.
A recomputed stage (an R for that microbatch and virtual stage) holds its activation from
R instead: F keeps only its input, which this count leaves out.
"""
from __future__ import annotations

from itertools import accumulate

from .ir import B, BW, F, R, W, Schedule, unit_tasks


def activations_per_rank(schedule: Schedule, kept: float = 1.0) -> list[float]:
    """The most activations each rank holds at once, in microbatches of one pipeline
    stage. `kept` (0..1): the fraction of a stage's activations a split B leaves held
    until its W (the simulator's weight_memory over activation_memory); 1, the default,
    counts every activation from F to W."""
    share = schedule.ranks / schedule.num_model_stages if schedule.num_model_stages else 0.0
    recomputed = {(t.mb, t.stage) for t in schedule.tasks() if t.op == R}
    at_b, at_w = share * (1.0 - kept), share * kept  # what B and W free
    step = {F: share, B: -at_b, W: -at_w, BW: -share}.get
    peaks = []
    for program in schedule.programs:
        firsts = [item[0] for item in program]  # an op, or an overlapped pair's first task
        if not recomputed and all(type(op) is str for op in firsts):  # no pairs: a running sum in one pass
            # held - x == held + (-x) exactly, and the peak after a W or B never exceeds
            # the one before it, so this is the loop below, op by op
            peaks.append(max(0.0, max(accumulate(step(op, 0.0) for op in firsts), default=0.0)))
            continue
        held = peak = 0.0
        for item in program:
            for task in unit_tasks(item):
                if task.op == R or (task.op == F and (task.mb, task.stage) not in recomputed):
                    held += share
                    peak = max(peak, held)
                elif task.op == B:
                    held -= at_b
                elif task.op == W:
                    held -= at_w
                elif task.op == BW:
                    held -= share
        peaks.append(peak)
    return peaks


def peak_activations(schedule: Schedule, kept: float = 1.0) -> float:
    """The most activations any rank holds (see `activations_per_rank`)."""
    return max(activations_per_rank(schedule, kept), default=0.0)
