"""The cost model: how long each op and transfer takes and how much memory it holds.

Units: seconds, bytes, bytes per second.

Costs are given per *pipeline stage* (one rank's share of the model, 1/p of it). A
schedule that cuts the model into S model stages charges each model stage p/S of its
pipeline stage's compute and memory; transfer sizes (the activation at a boundary) do
not shrink. A cost file may instead give every model stage its own costs, or the model
layer by layer (`simulator.layers`), which each schedule splits into its model stages.

This module is the model: its dataclasses and what they compute; one stage's costs
(`StageCost`, `CostError`) are in `simulator.stage_costs`. Cost files are
`simulator.cost_file`. Import any of them from `simulator.costs`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pipesched.schedules.numbers import is_int, is_real

from .layers import LayerCosts
from .stage_costs import CostError, StageCost, cut, merged

MIN_SHARE = 1e-6  # processors: the least capacity or demand a shared host may have


@dataclass(frozen=True)
class FixedOpTimes:
    """Seconds of each op kind that do not shrink when a model stage is cut into parts
    (dispatch, autograd bookkeeping, taking the input): a part of a stage whose F takes T
    takes (T - forward) / k + forward, not T / k. Read from runs at two splits of one
    model (`simulator.run_costs`); all 0 scales op times in proportion."""

    forward: float = 0.0
    backward_input: float = 0.0
    backward_weight: float = 0.0
    backward_full: float = 0.0

    def check(self) -> "FixedOpTimes":
        return _checked_nonnegative(self, "fixed_op_times", "number of seconds")

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def scaled(self, k: float) -> "FixedOpTimes":
        """Every fixed time k times as long."""
        return FixedOpTimes(*(getattr(self, f.name) * k for f in fields(self)))

    def taken_from(self, stage: StageCost) -> StageCost:
        """`stage` with these seconds taken off its op times (at least 0)."""
        return self._shifted(stage, -1.0)

    def added_to(self, stage: StageCost) -> StageCost:
        """`stage` with these seconds added to its op times."""
        return self._shifted(stage, 1.0)

    def _shifted(self, stage: StageCost, sign: float) -> StageCost:
        def shift(name: str) -> float | None:
            value = getattr(stage, name)
            return None if value is None else max(0.0, value + sign * getattr(self, name))

        return replace(stage, **{f.name: shift(f.name) for f in fields(self)})


@dataclass(frozen=True)
class StageSwitch:
    """How much longer an op runs right after an op of another stage on its rank, as a
    fraction of its own time (0.2: 20 % longer): `forward` for F (and R), `backward` for
    B, W and BW; `forward_second` and `backward_second` for the op after that one when it
    is of the same stage again (the other stage's data still shares the caches). Measured
    by calibration on CPUs (`executor.profile.switch_slowdown`); applied by
    `simulator.timing.resolve` to the tasks `simulator.switches` marks."""

    forward: float = 0.0
    backward: float = 0.0
    forward_second: float = 0.0
    backward_second: float = 0.0

    def check(self) -> "StageSwitch":
        return _checked_nonnegative(self, "stage_switch", "fraction")

    @property
    def any(self) -> bool:
        return bool(self.forward or self.backward or self.forward_second or self.backward_second)


def _checked_nonnegative(obj, name: str, what: str):
    """`obj` if every field of the dataclass is a finite number >= 0, else CostError."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if not is_real(value) or not math.isfinite(value) or value < 0:
            raise CostError(f"{name}.{f.name} must be a finite {what} >= 0, got {value!r}")
    return obj


@dataclass(frozen=True)
class Link:
    """A point-to-point transfer costs latency + bytes / bandwidth (seconds, bytes/s)."""

    latency: float = 0.0
    bandwidth: float = math.inf

    def check(self, where: str) -> None:
        for name in ("latency", "bandwidth"):
            value = getattr(self, name)
            if not is_real(value) or math.isnan(value):
                raise CostError(f"{where}.{name} must be a number, got {value!r}")
        if self.latency < 0 or math.isinf(self.latency):
            raise CostError(f"{where}.latency must be finite and >= 0, got {self.latency!r}")
        if self.bandwidth <= 0:
            raise CostError(f"{where}.bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")

    def time(self, nbytes: float) -> float:
        return self.latency + (nbytes / self.bandwidth if nbytes else 0.0)


@dataclass(frozen=True)
class Network:
    """Ranks r and q share a node when r // ranks_per_node == q // ranks_per_node."""

    intra: Link = Link()
    inter: Link | None = None  # None: same as intra
    ranks_per_node: int | None = None  # None: all ranks on one node

    def link(self, src: int, dst: int) -> Link:
        if self.ranks_per_node is None or self.inter is None or \
                src // self.ranks_per_node == dst // self.ranks_per_node:
            return self.intra
        return self.inter

    def check(self) -> None:
        self.intra.check("network")
        if self.inter is not None:
            self.inter.check("network.inter_node")
        rpn = self.ranks_per_node
        if rpn is not None and (not is_int(rpn) or rpn < 1):
            raise CostError(f"network.ranks_per_node must be an integer >= 1, got {rpn!r}")


MAX_DP_DEGREE = 1_000_000  # data-parallel replicas: far beyond any cluster, so a typo fails early
MAX_BUCKETS = 1_000_000    # all-reduce buckets of one stage: a tiny bucket size would run for ever


@dataclass(frozen=True)
class DataParallel:
    """`degree` replicas of the pipeline, each model stage's weight gradients all-reduced
    across them over a DP link of its own (not the pipeline's links): a ring all-reduce
    of n bytes over d replicas takes 2(d-1) * latency + 2(d-1)/d * n / bandwidth seconds
    (reduce-scatter then all-gather, each d-1 steps moving n/d bytes; Thakur, Rabenseifner
    and Gropp 2005, "Optimization of collective communication operations in MPICH";
    ../shared/reference.md). A stage's gradients go in buckets of at most `bucket_bytes`
    (None: one bucket), each a separate all-reduce paying the latency again.
    degree 1: no all-reduce (the optimizer step still runs when it costs time)."""

    degree: int = 1
    latency: float = 0.0          # seconds per ring step
    bandwidth: float = math.inf   # bytes/s of each rank's DP link
    bucket_bytes: float | None = None

    def check(self) -> "DataParallel":
        if not is_int(self.degree) or not 1 <= self.degree <= MAX_DP_DEGREE:
            raise CostError(f"data_parallel.degree must be an integer in 1..{MAX_DP_DEGREE:,}, got {self.degree!r}")
        Link(self.latency, self.bandwidth).check("data_parallel")
        b = self.bucket_bytes
        if b is not None and (not is_real(b) or not math.isfinite(b) or b <= 0):
            raise CostError(f"data_parallel.bucket_bytes must be a finite number of bytes > 0, got {b!r}")
        return self

    def buckets(self, nbytes: float) -> list[float]:
        """The sizes (bytes) of the all-reduces that carry `nbytes` of gradients."""
        if self.bucket_bytes is None or nbytes <= self.bucket_bytes:
            return [nbytes]
        full, rest = divmod(nbytes, self.bucket_bytes)
        if full + (rest > 0) > MAX_BUCKETS:
            raise CostError(f"data_parallel.bucket_bytes {self.bucket_bytes:g} cuts {nbytes:g} bytes of gradients "
                            f"into more than {MAX_BUCKETS:,} buckets; use larger buckets")
        return [float(self.bucket_bytes)] * int(full) + ([float(rest)] if rest > 0 else [])

    def allreduce_time(self, nbytes: float) -> float:
        """Seconds of one ring all-reduce of `nbytes` bytes (0 when degree is 1)."""
        d = self.degree
        if d == 1:
            return 0.0
        return 2 * (d - 1) * self.latency + (2 * (d - 1) / d * nbytes / self.bandwidth if nbytes else 0.0)


@dataclass(frozen=True)
class HostOverhead:
    """Host time a rank spends outside its ops (seconds): after each op (`per_op`:
    bookkeeping), posting each of its sends in turn (`per_send`; the transfer can start
    `send_start` into its posting, where a send's data leaves), posting each receive
    before the unit it is posted at (`per_recv`, see `simulator.posting`) and taking each
    arrived receive before its op (`per_take`). The rank cannot compute meanwhile, but
    the time is not part of any op's span."""

    per_op: float = 0.0
    per_send: float = 0.0
    per_recv: float = 0.0
    send_start: float | None = None  # None: once the whole posting is done (per_send)
    per_take: float = 0.0

    def check(self) -> "HostOverhead":
        for name in ("per_op", "per_send", "per_recv", "send_start", "per_take"):
            value = getattr(self, name)
            if name == "send_start" and value is None:
                continue
            if not is_real(value) or not math.isfinite(value) or value < 0:
                raise CostError(f"host_overhead.{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.send_start is not None and self.send_start > self.per_send:
            raise CostError(f"host_overhead.send_start ({self.send_start}) exceeds per_send ({self.per_send})")
        return self

    def scaled(self, factor: float) -> "HostOverhead":
        """Every host time `factor` times as long."""
        return HostOverhead(self.per_op * factor, self.per_send * factor, self.per_recv * factor,
                            None if self.send_start is None else self.send_start * factor, self.per_take * factor)

    @property
    def send_leaves(self) -> float:
        """Seconds into a send's posting when its data can leave."""
        return self.per_send if self.send_start is None else self.send_start

    @property
    def any(self) -> bool:
        return bool(self.per_op or self.per_send or self.per_recv or self.per_take)


@dataclass(frozen=True)
class GradientSum:
    """The sum of shared gradients between two ranks holding the same model stages
    (`simulator.shared_grads`), end to end: flattening the gradients, the message each
    way, adding and copying the sum back, from when both ranks start it until the later
    is through: `fixed` seconds + bytes * `per_byte` seconds, for the bytes one rank's
    gradients hold. Timed by calibration (`executor.sum_timing`); absent, the sum is
    priced by the pipeline's links and host times."""

    fixed: float = 0.0
    per_byte: float = 0.0

    def check(self) -> "GradientSum":
        return _checked_nonnegative(self, "gradient_sum", "number (seconds, seconds per byte)")

    def time(self, nbytes: float) -> float:
        """Seconds to sum `nbytes` bytes of gradients."""
        return self.fixed + nbytes * self.per_byte


@dataclass(frozen=True)
class HostSharing:
    """Ranks sharing compute (see simulator.sharing): `capacity` cores, or 1 for one GPU
    shared by time slicing; a computing rank asks for `compute_demand` cores, a rank
    waiting for data for `wait_demand` (a polling communication library).
    `interference`: how much slower compute runs when every core is busy than when one
    is (shared caches and memory bandwidth; 0.1 = 10 % slower), in between pro rata.
    `pinned`: rank r is pinned to core r mod capacity (one thread each, as the executor
    pins ranks that outnumber the cores) and shares that core with the ranks pinned to it;
    `switching`: how much slower than its fair share a rank computes on a core it
    time-shares (each switch evicts the other rank's data from the core's caches).
    `gpu`: the shared processor is `capacity` GPUs time-sliced between the ranks'
    contexts (gloo-cuda): only ops compete for it, while host time outside ops (posting
    and taking transfers, bookkeeping) runs on each rank's own CPU, unshared.
    `host_time_first`: on shared CPU cores, a rank's host time outside ops runs at once
    at full speed instead of taking a share of its core (the kernel runs a rank woken
    from a wait first; the ops computing beside it lose that time, which op durations
    read from runs already hold: `simulator.dedicated`)."""

    capacity: float
    compute_demand: float = 1.0
    wait_demand: float = 0.0
    interference: float = 0.0
    pinned: bool = False
    switching: float = 0.0
    gpu: bool = False
    host_time_first: bool = False

    def check(self) -> "HostSharing":
        for name in ("capacity", "compute_demand", "wait_demand", "interference", "switching"):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value) or value < 0:
                raise CostError(f"host.{name} must be a finite number >= 0, got {value!r}")
        for flag in ("pinned", "gpu", "host_time_first"):
            if not isinstance(getattr(self, flag), bool):
                raise CostError(f"host.{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.pinned and self.gpu:
            raise CostError("host.pinned is for CPU cores; a shared GPU (host.gpu) is not pinned")
        if self.pinned and (self.capacity != int(self.capacity) or self.compute_demand != 1):
            raise CostError("host.pinned needs a whole number of cores (capacity) and compute_demand 1")
        # far below a processor the DES would step forever (a denormal capacity never finishes work)
        if self.capacity < MIN_SHARE or self.compute_demand < MIN_SHARE:
            raise CostError(f"host.capacity and host.compute_demand must be at least {MIN_SHARE:g} cores, "
                            f"got {self.capacity}, {self.compute_demand}")
        return self


@dataclass(frozen=True)
class CostModel:
    """Everything the simulator needs to time a schedule.

    stages: per pipeline stage; one entry applies to every stage.
    model_stages: per model stage, instead of `stages`; a schedule must then have exactly
        this many model stages (CostError otherwise).
    overlap: how an overlapped pair (a, b) runs: a + b - overlap * min(a, b);
        0 is serial, 1 is perfect overlap.
    contention: a directed link carries one transfer at a time (FIFO).
    blocking_sends: a rank waits for its sends to complete before its next op.
    op_overhead: seconds added to every compute op (launch and bookkeeping).
    host: ranks share compute (None: every rank has its own).
    host_overhead: the runtime's host time outside ops (bookkeeping, posting transfers).
    comm_buffers: memory counts the payloads of transfers and V-turn hand-overs while
        buffered (see simulator.memory).
    recv_lookahead: receives are posted this many program units ahead of the op that
        needs them (< 0: all at the step's start), as the executor's --recv-lookahead.
    data_parallel: replicas of the pipeline and their gradient all-reduce (the step's
        tail, see simulator.data_parallel); the default, degree 1, adds nothing unless a
        stage's optimizer_time is set.
    layers: the model layer by layer (`simulator.layers`), instead of `stages` and
        `model_stages`: each schedule's model stages are its split of the layers.
    fixed_op_times: the part of each op kind's time in `model_stages` that stays whole
        when they are cut or merged for another split (`FixedOpTimes`).
    stage_switch: how much longer an op runs right after another stage's op on its rank
        (`StageSwitch`; 0 by default).
    gradient_sum: the calibrated time of summing gradients shared between ranks
        (`GradientSum`; None: priced by `network` and `host_overhead`).
    """

    stages: tuple[StageCost, ...] = (StageCost(),)
    model_stages: tuple[StageCost, ...] | None = None
    overlap: float = 0.0
    network: Network = Network()
    contention: bool = True
    blocking_sends: bool = False
    op_overhead: float = 0.0
    host: HostSharing | None = None
    host_overhead: HostOverhead = HostOverhead()
    comm_buffers: bool = True
    recv_lookahead: int = 2
    data_parallel: DataParallel = DataParallel()
    layers: LayerCosts | None = None
    fixed_op_times: FixedOpTimes = FixedOpTimes()
    stage_switch: StageSwitch = StageSwitch()
    gradient_sum: GradientSum | None = None
    meta: dict = field(default_factory=dict, compare=False)

    def slower(self, k: float) -> "CostModel":
        """This cost model with every op time (stages, model stages, layers, fixed op
        times, op overhead) and host time outside ops k times as long; transfers, memory
        and the optimizer step unchanged."""
        def each(stages):
            return None if stages is None else tuple(s.slower(k) for s in stages)

        layers = self.layers
        if layers is not None:
            layers = replace(layers, layers=each(layers.layers),
                             embedding=None if layers.embedding is None else layers.embedding.slower(k),
                             head=None if layers.head is None else layers.head.slower(k))
        return replace(self, stages=each(self.stages), model_stages=each(self.model_stages), layers=layers,
                       op_overhead=self.op_overhead * k, host_overhead=self.host_overhead.scaled(k),
                       fixed_op_times=self.fixed_op_times.scaled(k))

    def check(self) -> "CostModel":
        if not self.stages:
            raise CostError("stages is empty; give at least one stage's costs")
        for i, s in enumerate(self.stages):
            s.check(f"stages[{i}]")
        for i, s in enumerate(self.model_stages or ()):
            s.check(f"model_stages[{i}]")
        if not is_real(self.overlap) or not 0 <= self.overlap <= 1:
            raise CostError(f"overlap must be between 0 (serial) and 1 (perfect), got {self.overlap!r}")
        if not is_real(self.op_overhead) \
                or not math.isfinite(self.op_overhead) or self.op_overhead < 0:
            raise CostError(f"op_overhead must be finite and >= 0, got {self.op_overhead!r}")
        self.network.check()
        if not isinstance(self.comm_buffers, bool):
            raise CostError(f"comm_buffers must be true or false, got {self.comm_buffers!r}")
        if not is_int(self.recv_lookahead):
            raise CostError(f"recv_lookahead must be an integer (< 0: all at the start), got {self.recv_lookahead!r}")
        if self.host is not None:
            self.host.check()
        if not isinstance(self.host_overhead, HostOverhead):
            raise CostError("host_overhead must be an object with per_op, per_send and per_recv")
        self.host_overhead.check()
        if not isinstance(self.data_parallel, DataParallel):
            raise CostError("data_parallel must be an object with degree, latency, bandwidth and bucket_bytes")
        self.data_parallel.check()
        if not isinstance(self.fixed_op_times, FixedOpTimes):
            raise CostError("fixed_op_times must be an object with forward, backward_input, backward_weight and "
                            "backward_full (seconds)")
        self.fixed_op_times.check()
        if not isinstance(self.stage_switch, StageSwitch):
            raise CostError("stage_switch must be an object with forward and backward (fractions)")
        self.stage_switch.check()
        if self.gradient_sum is not None:
            if not isinstance(self.gradient_sum, GradientSum):
                raise CostError("gradient_sum must be an object with fixed (seconds) and per_byte (seconds per byte)")
            self.gradient_sum.check()
        if self.layers is not None:
            if self.model_stages is not None:
                raise CostError("give the model either as layers or as model_stages, not both")
            self.layers.check()
        return self

    def model_stage_costs(self, ranks: int, num_model_stages: int) -> list[StageCost]:
        """Costs of each of S model stages of a schedule on `ranks` ranks.

        With `layers`, the model stages of their split (CostError when S exceeds what the
        layers fill). `model_stages` given for a finer split of the same model (S divides
        their number) are merged, k consecutive stages into one (`merged`: exact for op
        times and memory); given for a coarser split (their number divides S), each is
        cut into equal parts (`cut`: assumes its layers cost alike), each keeping the
        ops' `fixed_op_times` whole. So a model calibrated once predicts schedules of any
        number of chunks per rank.
        CostError for any other number: silently using `stages` instead would predict a
        model the user did not describe."""
        if self.layers is not None:
            return self.layers.split_costs(num_model_stages)
        if self.model_stages is not None:
            have = len(self.model_stages)
            if have == num_model_stages:
                return list(self.model_stages)
            fixed = self.fixed_op_times
            whole = [fixed.taken_from(st) for st in self.model_stages] if fixed.any else list(self.model_stages)
            if num_model_stages and have % num_model_stages == 0:
                k = have // num_model_stages
                parts = [merged(whole[i * k:(i + 1) * k]) for i in range(num_model_stages)]
            elif num_model_stages % have == 0:
                parts = cut(whole, num_model_stages // have)
            else:
                raise CostError(f"the costs give model_stages for {have} model stages but the schedule has "
                                f"{num_model_stages}, neither a multiple nor a divisor; calibrate for this "
                                "schedule, or drop model_stages to scale the per-rank stages")
            return [fixed.added_to(st) for st in parts] if fixed.any else parts
        if len(self.stages) not in (1, ranks):
            raise CostError(f"cost model gives {len(self.stages)} pipeline stages but the schedule has {ranks} ranks")
        k = ranks / num_model_stages
        return [self.stages[0 if len(self.stages) == 1 else min(ranks - 1, int(ms * ranks // num_model_stages))].scaled(k)
                for ms in range(num_model_stages)]

    def recomputed_stages(self, ranks: int, num_model_stages: int) -> set[int]:
        """The model stages whose costs ask for recomputation (`StageCost.recompute`)."""
        return {k for k, c in enumerate(self.model_stage_costs(ranks, num_model_stages)) if c.recompute}

    def op_time_for(self, ranks: int):
        """op_time(op, model_stage, num_model_stages) -> seconds, for cost-adaptive builders."""
        cache: dict[int, list[StageCost]] = {}

        def op_time(op: str, model_stage: int, num_model_stages: int) -> float:
            if num_model_stages not in cache:
                cache[num_model_stages] = self.model_stage_costs(ranks, num_model_stages)
            return cache[num_model_stages][model_stage].op_time(op) + self.op_overhead

        return op_time

    def pair_time(self, a: float, b: float) -> float:
        return a + b - self.overlap * min(a, b)


def uniform(f: float = 1.0, b: float = 1.0, w: float = 1.0, *, latency: float = 0.0,
            bandwidth: float = math.inf, **kwargs: Any) -> CostModel:
    """Same T_F, T_B, T_W (seconds) on every pipeline stage, transfers of latency +
    bytes / bandwidth (seconds, bytes/s) between any two ranks; StageCost fields
    (activation_bytes, activation_memory, ...) and other CostModel fields by keyword."""
    stage_keys = {f.name for f in fields(StageCost)}
    stage = StageCost(forward=f, backward_input=b, backward_weight=w,
                      **{k: v for k, v in kwargs.items() if k in stage_keys})
    rest = {k: v for k, v in kwargs.items() if k not in stage_keys}
    if "network" not in rest:
        rest["network"] = Network(Link(latency, bandwidth))
    elif latency or bandwidth != math.inf:
        raise CostError("give either network= or latency= and bandwidth=, not both")
    return CostModel(stages=(stage,), **rest).check()
