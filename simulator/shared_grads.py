"""The sum of shared gradients at each step's end: ranks holding one model stage.

A schedule may place a model stage on several ranks (DualPipe holds model stage k on
ranks k and p-1-k). Each copy's gradients cover only its own microbatches, so the
executor ends every step with their sum on every holder (`executor.replicas`): the
ranks that hold the same model stages form a group, and the group's lowest rank leads.
Every other member sends the leader its gradients as one message once its own step is
done (pipeline ops, sends drained, data-parallel all-reduces); the leader takes them in
rank order, adds, and sends the sum back to each member. So no member ends its step
before the group's slowest member has ended its pipeline, plus two transfers of the
gradient bytes: a barrier among the group's ranks that the next step starts from.

Per rank r (seconds; `done[r]` its step without the sum; each message of n bytes
takes `Network.link(src, dst).time(n)`; host times are `HostOverhead`'s, the same a
pipeline transfer costs, of the one cost model for every rank):

1. r posts a send to the leader of each group it is a member of (per_send each; the
   data leaves send_leaves into the posting);
2. for each group it leads, r posts a receive from each member in rank order
   (per_recv) and takes it once it has arrived (per_take), then posts the sum's sends
   to the members in turn (per_send each);
3. for each group it is a member of, r posts a receive for the sum (per_recv) and takes
   it once it has arrived (per_take);
4. r is done when every one of its sends has arrived.

Adding the gradients and copying them in and out of one flat buffer is not timed here
(memory-bound work on bytes that also cross a link twice), nor does the default process
group the sum uses necessarily move bytes as fast as the pipeline's links: at tens of
MB on a CPU host both made the sum several times slower than these steps price it
(docs/accuracy.md), which the calibrated sum below holds. Bytes per group: the
weight-gradient bytes (`StageCost.synced_bytes`) of its model stages, per model stage;
a cost model without parameter bytes sends empty messages (latency only). Parameters
tied across model stages (one embedding on the first and last stage) are summed by the
executor too but are not in a schedule or a cost model, so not here.

With a calibrated sum (`CostModel.gradient_sum`, a `GradientSum`: the executor's own
routine timed end to end between two ranks starting together, copies included) the
steps above give way to it: each group in turn, in rank order, starts once its last
member is done (a rank in several groups once it is through the ones before) and every
member ends `gradient_sum.time(nbytes)` later. A group of g > 2 ranks takes the per-byte
part g - 1 times (its leader takes and returns each member's message in turn); that
is extrapolated from pairs, the only groups calibration times and DualPipe has.

Every step is max/plus of `done` and constants, so the sum is max-plus linear:
`simulator.steps` applies it to each column of the step matrix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipesched.schedules.ir import Schedule

from .cost_model import GradientSum, HostOverhead, Network
from .stage_costs import StageCost


@dataclass(frozen=True)
class SumGroup:
    """Ranks that sum their copies' gradients (ascending; the first leads) and the bytes
    each member's message carries (and the sum sent back)."""

    ranks: tuple[int, ...]
    nbytes: float


def sum_groups(schedule: Schedule, stage_costs: Sequence[StageCost]) -> list[SumGroup]:
    """The groups of ranks holding the same model stages, each model stage held by more
    than one rank; ordered by their ranks, as the executor orders them. `stage_costs`:
    per model stage."""
    holders: dict[int, set[int]] = {}
    for st in schedule.stages:
        holders.setdefault(st.model_stage, set()).add(st.rank)
    nbytes: dict[tuple[int, ...], float] = {}
    for k, ranks in holders.items():
        if len(ranks) > 1:
            key = tuple(sorted(ranks))
            nbytes[key] = nbytes.get(key, 0.0) + stage_costs[k].synced_bytes
    return [SumGroup(ranks, n) for ranks, n in sorted(nbytes.items())]


@dataclass(frozen=True)
class SharedSums:
    """The sums of one schedule's shared gradients under one cost model (module doc)."""

    groups: tuple[SumGroup, ...]
    network: Network
    host: HostOverhead
    calibrated: GradientSum | None = None  # the sum timed end to end (module doc)

    def ends(self, done: np.ndarray) -> np.ndarray:
        """Seconds when each rank's step ends, the sums included, from `done` (seconds
        per rank when its step would end without them; -inf: not reached, as in a column
        of `simulator.steps.step_matrix`). Ranks in no group keep their time."""
        done = np.asarray(done, dtype=float)
        if self.calibrated is not None:
            return self._calibrated_ends(done)
        h = self.host
        clock = done.copy()      # each rank's host, through steps 1-3
        last_arrival = np.full(len(done), -np.inf)  # step 4: its sends' arrivals
        to_leader: dict[tuple[int, int], float] = {}  # (group, member) -> arrival at the leader
        for g, group in enumerate(self.groups):  # 1: every member's send, before anyone waits
            leader = group.ranks[0]
            for q in group.ranks[1:]:
                arrival = clock[q] + h.send_leaves + self._link(q, leader, group)
                to_leader[g, q] = arrival
                last_arrival[q] = max(last_arrival[q], arrival)
                clock[q] += h.per_send
        to_member: dict[tuple[int, int], float] = {}  # (group, member) -> the sum's arrival
        for g, group in enumerate(self.groups):  # 2: the leaders gather, add, send back
            leader = group.ranks[0]
            for q in group.ranks[1:]:
                clock[leader] = max(clock[leader] + h.per_recv, to_leader[g, q]) + h.per_take
            for q in group.ranks[1:]:
                arrival = clock[leader] + h.send_leaves + self._link(leader, q, group)
                to_member[g, q] = arrival
                last_arrival[leader] = max(last_arrival[leader], arrival)
                clock[leader] += h.per_send
        for g, group in enumerate(self.groups):  # 3: the members take the sum
            for q in group.ranks[1:]:
                clock[q] = max(clock[q] + h.per_recv, to_member[g, q]) + h.per_take
        return np.maximum(clock, last_arrival)

    def _calibrated_ends(self, done: np.ndarray) -> np.ndarray:
        """`ends` with the calibrated sum: each group in turn from its last member's
        time, every member through it `calibrated` seconds for its bytes later."""
        clock = done.copy()
        for group in self.groups:
            members = list(group.ranks)
            # the per-byte part once per member besides the leader
            clock[members] = clock[members].max() + self.calibrated.time((len(members) - 1) * group.nbytes)
        return clock

    def _link(self, src: int, dst: int, group: SumGroup) -> float:
        """Seconds one message of the group's bytes takes from `src` to `dst`."""
        return self.network.link(src, dst).time(group.nbytes)


def shared_sums(schedule: Schedule, stage_costs: Sequence[StageCost], network: Network,
                host: HostOverhead, calibrated: GradientSum | None = None) -> SharedSums | None:
    """The shared-gradient sums of `schedule` (None where every model stage is on one
    rank). `stage_costs`: per model stage; `calibrated`: the sum timed end to end (the
    cost model's `gradient_sum`), None to price it by `network` and `host`."""
    groups = sum_groups(schedule, stage_costs)
    return SharedSums(tuple(groups), network, host, calibrated) if groups else None
