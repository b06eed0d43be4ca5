"""The steady-state period of a step repeated back to back: a max-plus eigenvalue.

The algebra lives in `schedules.maxplus` (builders rank orders by the period too, and
schedules/ does not import the simulator); this module keeps its names for the
simulator (`simulator.steps` builds A under a cost model). Seconds in, seconds out.
"""
from __future__ import annotations

from pipesched.schedules.maxplus import MAX_CRITICAL_NODES, apply, critical_nodes, max_cycle_mean

__all__ = ["MAX_CRITICAL_NODES", "apply", "critical_nodes", "max_cycle_mean"]
