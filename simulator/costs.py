"""The cost model and its files, in one place to import them from.

How long each op and transfer takes and how much memory it holds (seconds, bytes,
bytes per second), in three parts:
  - `simulator.stage_costs`: one stage's costs per microbatch (`StageCost`, `CostError`,
    and how stages merge and cut);
  - `simulator.cost_model`: the whole model (`CostModel`, `Link`, `Network`,
    `DataParallel`, `HostSharing`, `HostOverhead`, `FixedOpTimes`, `StageSwitch`,
    `GradientSum`,
    `uniform`); a model may be given layer by layer (`simulator.layers`);
  - `simulator.cost_file`: the `pipesched.costs/1` file format (`from_dict`, `to_dict`,
    `load`, `save`), JSON or TOML.
This module only re-exports them: `from pipesched.simulator.costs import CostModel, load`.
"""
from __future__ import annotations

from .cost_file import FORMAT, from_dict, load, save, to_dict
from .cost_model import (MAX_BUCKETS, MAX_DP_DEGREE, MIN_SHARE, CostModel, DataParallel, FixedOpTimes, GradientSum,
                         HostOverhead, HostSharing, Link, Network, StageSwitch, uniform)
from .stage_costs import CostError, StageCost, cut, merged

__all__ = ["CostError", "StageCost", "merged", "cut", "FixedOpTimes", "StageSwitch", "Link", "Network",
           "DataParallel", "GradientSum", "HostOverhead", "HostSharing", "CostModel", "uniform", "MIN_SHARE",
           "MAX_DP_DEGREE", "MAX_BUCKETS", "FORMAT", "from_dict", "to_dict", "load", "save"]
