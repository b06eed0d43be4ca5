"""The cost model: how long each op and transfer takes and how much memory it holds.

Units: seconds, bytes, bytes per second.

Costs are given per *pipeline stage* (one rank's share of the model, 1/p of it). A
schedule that cuts the model into S model stages charges each model stage p/S of its
pipeline stage's compute and memory; transfer sizes (the activation at a boundary) do
not shrink. A cost file may instead give every model stage its own costs, or the model
layer by layer (`simulator.layers`), which each schedule splits into its model stages.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pipesched.schedules.ir import B, BW, F, R, W
from pipesched.schedules.numbers import is_int, is_real
from pipesched.schedules.outputs import write_text

from .units import UnitError, parse_bandwidth, parse_bytes, parse_seconds

if TYPE_CHECKING:
    from .layers import LayerCosts

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FORMAT = "pipesched.costs/1"
MIN_SHARE = 1e-6  # processors: the least capacity or demand a shared host may have


class CostError(ValueError):
    """A cost file or value is unusable; the message names the field."""


@dataclass(frozen=True)
class StageCost:
    """Per-microbatch costs of one stage.

    forward, backward_input, backward_weight: T_F, T_B, T_W in seconds.
    backward_full: T_BW of the fused backward; None means T_B + T_W.
    activation_bytes: size of the activation this stage sends to the next one.
    gradient_bytes: size of the gradient sent back to the previous stage (None: same as
        the activation arriving at this stage, i.e. the previous stage's activation_bytes).
    activation_memory: bytes an F stores until its backward.
    weight_memory: bytes a split B leaves held until its W: the part of the activations W
        still needs plus the gradients B captured for it (so it may exceed activation_memory).
    param_bytes: resident bytes of this stage's parameters, gradients and optimizer state.
    grad_accumulate: seconds of T_W / T_BW spent adding the weight gradients into those of
        earlier microbatches; the first W or BW of a stage in a step (on a rank) only
        keeps its gradients and takes that much less.
    weight_grad_bytes: bytes of this stage's weight gradients, all-reduced across the
        data-parallel replicas once per step (None: param_bytes, which calibration
        measures as the parameters' own bytes, the size of their gradients).
    optimizer_time: seconds of this stage's optimizer step, once per step (not per
        microbatch), after its gradients are all-reduced (see simulator.data_parallel).
    recompute: this stage recomputes its activations (an R before each backward) when a
        schedule is built with these costs; `--recompute` turns it on for every stage.
    recompute_fraction: T_R = recompute_fraction x T_F, seconds (1: full recomputation;
        below 1: selective, only part of the forward, e.g. attention, is re-run).
    recompute_memory: bytes an F of a recomputing stage keeps until its R (the stage
        input, plus what selective recomputation does not re-create); None: the stage
        input, i.e. the activation_bytes arriving from the previous model stage (0 for
        the first, whose input is the data). R holds activation_memory in all.
    """

    forward: float = 1.0
    backward_input: float = 1.0
    backward_weight: float = 1.0
    backward_full: float | None = None
    activation_bytes: float = 0.0
    gradient_bytes: float | None = None
    activation_memory: float = 0.0
    weight_memory: float = 0.0
    param_bytes: float = 0.0
    grad_accumulate: float = 0.0
    weight_grad_bytes: float | None = None
    optimizer_time: float = 0.0
    recompute: bool = False
    recompute_fraction: float = 1.0
    recompute_memory: float | None = None

    def check(self, where: str) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("backward_full", "gradient_bytes", "weight_grad_bytes", "recompute_memory"):
                continue
            if f.name == "recompute":
                if not isinstance(value, bool):
                    raise CostError(f"{where}.recompute must be true or false, got {value!r}")
                continue
            if not is_real(value):
                raise CostError(f"{where}.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise CostError(f"{where}.{f.name} must be finite and >= 0, got {value!r}")

    def slower(self, k: float) -> "StageCost":
        """This stage with its op times (F, B, W, BW, gradient accumulation) k times as
        long; memory, bytes and the optimizer step unchanged."""
        return replace(
            self, forward=self.forward * k, backward_input=self.backward_input * k,
            backward_weight=self.backward_weight * k,
            backward_full=None if self.backward_full is None else self.backward_full * k,
            grad_accumulate=self.grad_accumulate * k)

    def scaled(self, k: float) -> "StageCost":
        """This stage's costs for a k-fraction of it (compute and memory scale, boundary sizes do not)."""
        return replace(
            self.slower(k), activation_memory=self.activation_memory * k, weight_memory=self.weight_memory * k,
            param_bytes=self.param_bytes * k,
            weight_grad_bytes=None if self.weight_grad_bytes is None else self.weight_grad_bytes * k,
            optimizer_time=self.optimizer_time * k,
            recompute_memory=None if self.recompute_memory is None else self.recompute_memory * k)

    @property
    def synced_bytes(self) -> float:
        """Bytes of weight gradients this stage all-reduces per step."""
        return self.param_bytes if self.weight_grad_bytes is None else self.weight_grad_bytes

    def op_time(self, op: str) -> float:
        if op == F:
            return self.forward
        if op == B:
            return self.backward_input
        if op == W:
            return self.backward_weight
        if op == BW:
            return self.backward_input + self.backward_weight if self.backward_full is None else self.backward_full
        if op == R:
            return self.forward * self.recompute_fraction
        raise CostError(f"unknown op {op!r}")


def merged(stages: Sequence[StageCost]) -> StageCost:
    """One model stage made of consecutive `stages`: op times, memory, parameters and
    optimizer time add up; what crosses its boundaries is what crosses the last one's;
    it recomputes if all of them do, the recomputed share of F weighted by forward time,
    keeping what the first keeps."""
    last = stages[-1]
    full = None if all(s.backward_full is None for s in stages) else sum(s.op_time(BW) for s in stages)
    forward = sum(s.forward for s in stages)
    fraction = (sum(s.recompute_fraction * s.forward for s in stages) / forward if forward > 0
                else stages[0].recompute_fraction)
    return StageCost(
        forward=forward, backward_input=sum(s.backward_input for s in stages),
        backward_weight=sum(s.backward_weight for s in stages), backward_full=full,
        activation_bytes=last.activation_bytes, gradient_bytes=last.gradient_bytes,
        activation_memory=sum(s.activation_memory for s in stages),
        weight_memory=sum(s.weight_memory for s in stages), param_bytes=sum(s.param_bytes for s in stages),
        grad_accumulate=sum(s.grad_accumulate for s in stages),
        weight_grad_bytes=(None if all(s.weight_grad_bytes is None for s in stages)
                           else sum(s.synced_bytes for s in stages)),
        optimizer_time=sum(s.optimizer_time for s in stages),
        recompute=all(s.recompute for s in stages), recompute_fraction=fraction,
        recompute_memory=stages[0].recompute_memory)


def cut(stages: Sequence[StageCost], k: int) -> list[StageCost]:
    """Each of `stages` (consecutive model stages) cut into `k` equal parts.

    The first model stage's input is the data, which needs no gradient, so its measured
    B does next to nothing and its W does the whole backward. Its later parts do get an
    input from a part before them: their B and W take the shape of the later stages'
    (B's share of B + W, and B + W over a fused BW where both are known, since a split
    backward costs more than a fused one). With one stage there is no shape to borrow."""
    parts = [stage.scaled(1 / k) for stage in stages for _ in range(k)]
    later = stages[1:]
    b, w = math.fsum(s.backward_input for s in later), math.fsum(s.backward_weight for s in later)
    if k == 1 or not later or b + w <= 0:
        return parts
    first = parts[0]
    backward = first.backward_input + first.backward_weight
    fused = [s.backward_full for s in later]
    if first.backward_full is not None and all(f is not None and f > 0 for f in fused):
        backward = first.backward_full * (b + w) / math.fsum(fused)
    inner = replace(first, backward_input=backward * b / (b + w), backward_weight=backward * w / (b + w))
    return [first] + [inner] * (k - 1) + parts[k:]


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
            return self.layers.stage_costs(self.layers.split(num_model_stages))
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


# --- cost files ---------------------------------------------------------------------

_OVERLAP_WORDS = {"serial": 0.0, "perfect": 1.0}
# fields a hand-written file may give with a unit ("12ms", "128MiB", "50GB/s")
_SECONDS = {"forward", "backward_input", "backward_weight", "backward_full", "grad_accumulate", "latency",
            "optimizer_time", "op_overhead", "per_op", "per_send", "per_recv", "send_start", "per_take"}
_BYTES = {"activation_bytes", "gradient_bytes", "activation_memory", "weight_memory", "param_bytes",
          "weight_grad_bytes", "bucket_bytes", "recompute_memory"}


def _units(data: Any, where: str) -> Any:
    """`data` with every string in a time, size or bandwidth field read as a quantity."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, value in data.items():
        if not isinstance(value, str):
            continue
        parse = (parse_seconds if key in _SECONDS else parse_bytes if key in _BYTES
                 else parse_bandwidth if key == "bandwidth" else None)
        if parse is not None:
            try:
                out[key] = parse(value)
            except UnitError as exc:
                raise CostError(f"{where}.{key}: {exc}") from None
    return out


def _stage(data: Any, where: str) -> StageCost:
    if not isinstance(data, dict):
        raise CostError(f"{where} must be an object of stage costs, got {type(data).__name__}")
    data = _units(data, where)
    known = {f.name for f in fields(StageCost)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CostError(f"{where} has unknown field {unknown[0]!r}; fields are {', '.join(sorted(known))}")
    stage = StageCost(**data)
    stage.check(where)
    return stage


def _link(data: Any, where: str) -> Link:
    if not isinstance(data, dict):
        raise CostError(f"{where} must be an object with latency and bandwidth")
    data = _units(data, where)
    unknown = sorted(set(data) - {"latency", "bandwidth"})
    if unknown:
        raise CostError(f"{where} has unknown field {unknown[0]!r}; fields are latency, bandwidth")
    link = Link(latency=data.get("latency", 0.0), bandwidth=data.get("bandwidth", math.inf))
    link.check(where)
    return link


def from_dict(data: Any) -> CostModel:
    """Parse a `pipesched.costs/1` document (already loaded from JSON or TOML)."""
    if not isinstance(data, dict):
        raise CostError("cost file must hold an object at the top level")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise CostError(f"cost file format is {fmt!r}, expected {FORMAT!r}")
    allowed = {"format", "stage", "stages", "model_stages", "overlap", "network", "contention",
               "blocking_sends", "op_overhead", "host", "host_overhead", "comm_buffers", "recv_lookahead",
               "data_parallel", "layers", "fixed_op_times", "stage_switch", "meta"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise CostError(f"cost file has unknown field {unknown[0]!r}; fields are {', '.join(sorted(allowed))}")
    default = _stage(data.get("stage", {}), "stage")
    base = {k: v for k, v in data.get("stage", {}).items()}
    stages: tuple[StageCost, ...] = (default,)
    if "stages" in data:
        if not isinstance(data["stages"], list) or not data["stages"]:
            raise CostError("stages must be a non-empty list of stage costs")
        stages = tuple(_stage({**base, **s} if isinstance(s, dict) else s, f"stages[{i}]")
                       for i, s in enumerate(data["stages"]))
    model_stages = None
    if "model_stages" in data:
        if not isinstance(data["model_stages"], list) or not data["model_stages"]:
            raise CostError("model_stages must be a non-empty list of stage costs")
        model_stages = tuple(_stage(s, f"model_stages[{i}]") for i, s in enumerate(data["model_stages"]))
    overlap = data.get("overlap", 0.0)
    if isinstance(overlap, str):
        if overlap not in _OVERLAP_WORDS:
            raise CostError(f"overlap must be 'serial', 'perfect' or a number in [0, 1], got {overlap!r}")
        overlap = _OVERLAP_WORDS[overlap]
    net = data.get("network", {})
    if not isinstance(net, dict):
        raise CostError("network must be an object")
    unknown = sorted(set(net) - {"latency", "bandwidth", "ranks_per_node", "inter_node"})
    if unknown:
        raise CostError(f"network has unknown field {unknown[0]!r}; fields are latency, bandwidth, ranks_per_node, inter_node")
    network = Network(
        intra=_link({k: net[k] for k in ("latency", "bandwidth") if k in net}, "network"),
        inter=_link(net["inter_node"], "network.inter_node") if "inter_node" in net else None,
        ranks_per_node=net.get("ranks_per_node"))
    for flag in ("contention", "blocking_sends", "comm_buffers"):
        if flag in data and not isinstance(data[flag], bool):
            raise CostError(f"{flag} must be true or false, got {data[flag]!r}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise CostError("meta must be an object")
    host = data.get("host")
    if host is not None:
        if not isinstance(host, dict) or "capacity" not in host:
            raise CostError("host must be an object with capacity (and compute_demand, wait_demand)")
        fields_ = {"capacity", "compute_demand", "wait_demand", "interference", "pinned", "switching", "gpu",
                   "host_time_first"}
        unknown = sorted(set(host) - fields_)
        if unknown:
            raise CostError(f"host has unknown field {unknown[0]!r}; fields are {', '.join(sorted(fields_))}")
        host = HostSharing(**host)
    overhead = data.get("host_overhead", {})
    if not isinstance(overhead, dict):
        raise CostError("host_overhead must be an object with per_op, per_send and per_recv (seconds)")
    unknown = sorted(set(overhead) - {"per_op", "per_send", "per_recv", "send_start", "per_take"})
    if unknown:
        raise CostError(f"host_overhead has unknown field {unknown[0]!r}; fields are per_op, per_send, per_recv, "
                        "send_start, per_take")
    host_overhead = HostOverhead(**_units(overhead, "host_overhead"))
    dp = data.get("data_parallel", {})
    if not isinstance(dp, dict):
        raise CostError("data_parallel must be an object with degree, latency, bandwidth and bucket_bytes")
    dp_fields = {"degree", "latency", "bandwidth", "bucket_bytes"}
    unknown = sorted(set(dp) - dp_fields)
    if unknown:
        raise CostError(f"data_parallel has unknown field {unknown[0]!r}; fields are {', '.join(sorted(dp_fields))}")
    data_parallel = DataParallel(**_units(dp, "data_parallel"))
    fixed_op_times = FixedOpTimes(**_units(_fields_of(data, "fixed_op_times", FixedOpTimes, "seconds"),
                                           "fixed_op_times"))
    stage_switch = StageSwitch(**_fields_of(data, "stage_switch", StageSwitch, "fractions"))
    layers = None
    if "layers" in data:
        from .layers import layers_from_dict  # it builds on this module
        both = next((k for k in ("stage", "stages", "model_stages") if k in data), None)
        if both:
            raise CostError(f"give the model either layer by layer (layers) or per stage ({both}), not both")
        layers = layers_from_dict(data["layers"])
    return CostModel(stages=stages, model_stages=model_stages, overlap=overlap, network=network,
                     contention=data.get("contention", True), blocking_sends=data.get("blocking_sends", False),
                     op_overhead=_units(data, "cost file").get("op_overhead", 0.0), host=host, host_overhead=host_overhead,
                     comm_buffers=data.get("comm_buffers", True), recv_lookahead=data.get("recv_lookahead", 2),
                     data_parallel=data_parallel, layers=layers, fixed_op_times=fixed_op_times,
                     stage_switch=stage_switch, meta=meta).check()


def _fields_of(data: dict, name: str, cls, unit: str) -> dict:
    """The object `data[name]` (empty where absent), CostError unless its keys are fields
    of the dataclass `cls`."""
    value = data.get(name, {})
    names = {f.name for f in fields(cls)}
    if not isinstance(value, dict) or set(value) - names:
        raise CostError(f"{name} must be an object with {', '.join(sorted(names))} ({unit})")
    return value


def to_dict(model: CostModel) -> dict:
    """The `pipesched.costs/1` document of a cost model (round-trips through from_dict)."""
    defaults = StageCost()

    def stage(s: StageCost) -> dict:
        # the recompute options only when set, so files of models without them stay as they were
        return {f.name: getattr(s, f.name) for f in fields(StageCost) if getattr(s, f.name) is not None
                and not (f.name.startswith("recompute") and getattr(s, f.name) == getattr(defaults, f.name))}

    def link(l: Link) -> dict:
        d = {"latency": l.latency}
        if not math.isinf(l.bandwidth):
            d["bandwidth"] = l.bandwidth
        return d

    net: dict[str, Any] = link(model.network.intra)
    if model.network.ranks_per_node is not None:
        net["ranks_per_node"] = model.network.ranks_per_node
    if model.network.inter is not None:
        net["inter_node"] = link(model.network.inter)
    doc: dict[str, Any] = {"format": FORMAT}
    if model.layers is None:  # layers replace the per-stage costs
        doc["stages"] = [stage(s) for s in model.stages]
    if model.model_stages is not None:
        doc["model_stages"] = [stage(s) for s in model.model_stages]
    doc.update(overlap=model.overlap, network=net, contention=model.contention,
               blocking_sends=model.blocking_sends, op_overhead=model.op_overhead,
               comm_buffers=model.comm_buffers, recv_lookahead=model.recv_lookahead)
    if model.host is not None:
        doc["host"] = {"capacity": model.host.capacity, "compute_demand": model.host.compute_demand,
                       "wait_demand": model.host.wait_demand, "interference": model.host.interference,
                       "pinned": model.host.pinned, "switching": model.host.switching, "gpu": model.host.gpu}
        if model.host.host_time_first:
            doc["host"]["host_time_first"] = True
    if model.fixed_op_times.any:
        doc["fixed_op_times"] = asdict(model.fixed_op_times)
    if model.stage_switch.any:  # the second op's fractions only where set, so older files stay as they were
        doc["stage_switch"] = {k: v for k, v in asdict(model.stage_switch).items()
                               if v or k in ("forward", "backward")}
    if model.host_overhead.any:
        o = model.host_overhead
        doc["host_overhead"] = {"per_op": o.per_op, "per_send": o.per_send, "per_recv": o.per_recv,
                                "per_take": o.per_take}
        if o.send_start is not None:
            doc["host_overhead"]["send_start"] = o.send_start
    if model.data_parallel != DataParallel():
        dp = model.data_parallel
        doc["data_parallel"] = {"degree": dp.degree, "latency": dp.latency}
        if not math.isinf(dp.bandwidth):
            doc["data_parallel"]["bandwidth"] = dp.bandwidth
        if dp.bucket_bytes is not None:
            doc["data_parallel"]["bucket_bytes"] = dp.bucket_bytes
    if model.layers is not None:
        from .layers import layers_to_dict
        doc["layers"] = layers_to_dict(model.layers)
    if model.meta:
        doc["meta"] = model.meta
    return doc


def load(path: str | Path) -> CostModel:
    """Read a cost file: JSON, or TOML when the name ends in .toml."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CostError(f"cannot read cost file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CostError(f"cost file {str(path)!r} is not UTF-8 text (JSON or TOML)") from None
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except RecursionError:
        raise CostError(f"cost file {str(path)!r} nests too deeply") from None
    except ValueError as exc:
        raise CostError(f"cost file {str(path)!r} is not valid {'TOML' if path.suffix.lower() == '.toml' else 'JSON'}: {exc}") from None
    try:
        return from_dict(data)
    except TypeError as exc:  # e.g. a stage given as a list
        raise CostError(f"cost file {str(path)!r}: {exc}") from None


def save(model: CostModel, path: str | Path) -> None:
    """Write the cost file (JSON) atomically."""
    write_text(path, json.dumps(to_dict(model), indent=2) + "\n")
