"""Point-to-point transfers of one rank: posting, completion, timeouts, host staging.

Every transfer is one edge of the task graph and its tag is the edge id, so messages in
flight between the same two ranks never mix up (gloo matches by tag). Work handles are
kept until they complete.

gloo (`GlooTransport`): every directed link gets a process group of its own
(`link_groups`), so each gloo connection carries data one way: over one connection,
simultaneous sends in both directions stalled for milliseconds in a large share of
exchanges, against almost never with a connection per direction (docs/executor.md).
A gloo send only reports completion through a blocking `wait`,
so each send is waited on by a thread of a pool sized to the rank's transfers (no send
ever queues behind another, so no wait can hold up a transfer another one depends on);
the waiter stamps the completion time and releases the buffer at once. The rank's own
thread waits on a receive only when its op needs it (so the data path has no thread
hand-over); a receive span ends when that wait returns. With CUDA compute
(`gloo-cuda`), tensors are staged through host memory.

NCCL (`NcclTransport`): NCCL matches messages between two ranks in posting order, not by
tag, so the runtime posts a link's receives in the sender's order; a unit's receives are
posted together (`batch_isend_irecv`). Completion is polled (`is_completed`).

A transfer that does not complete within `timeout` seconds raises `ExecutorError`
naming the rank, the op and the peer.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from pipesched.schedules.ir import Task

from .clock import now
from .memory import MemoryLedger
from .models import TensorSpec
from .placement import loops_off_own_cores


class ExecutorError(RuntimeError):
    """A rank could not finish its step; the message names the rank, the op and the peer.
    `exit_status`: what the CLI exits with (1: the run failed)."""

    exit_status = 1


class HostOutOfMemory(ExecutorError):
    """The ranks were stopped before the host ran out of memory (the model, or the runs
    of one command together, are too large for it): exit status 2, as for bad input."""

    exit_status = 2


@dataclass(frozen=True)
class Transfer:
    """One edge crossing ranks, as seen from this rank."""

    edge: int
    peer: int
    producer: Task
    consumer: Task
    kind: str  # "activation" or "gradient"

    def what(self) -> str:
        return f"the {self.kind} of {self.producer} (for {self.consumer})"


@dataclass
class Done:
    """A completed transfer: `lane` is "send" or "recv"; times in seconds. A receive also
    says when its consumer began to take it (`taken`): a receive that ends well after
    that was waited for, so its end is when the data arrived (which replay uses)."""

    transfer: Transfer
    lane: str
    start: float
    end: float
    taken: float = float("nan")


class _Pending:
    __slots__ = ("transfer", "tensor", "key", "work", "posted", "future")

    def __init__(self, transfer: Transfer, tensor: Tensor, key: int | None, work, posted: float):
        self.transfer, self.tensor, self.key, self.work, self.posted = transfer, tensor, key, work, posted
        self.future: cf.Future | None = None


_LINK_GROUPS: dict[tuple[int, int, int], object] = {}  # (world group id, src, dst) -> process group


def link_groups(links: list[tuple[int, int]]) -> dict[tuple[int, int], object]:
    """A process group per directed link (src, dst), created once per process and
    reused. Collective: every rank must call it with the same links, in any order. The
    groups' event loops run off the rank's own cores (`placement.loops_off_own_cores`)."""
    world = id(dist.group.WORLD)
    out = {}
    with loops_off_own_cores():
        for src, dst in sorted(set(links)):
            key = (world, src, dst)
            if key not in _LINK_GROUPS:
                _LINK_GROUPS[key] = dist.new_group(sorted((src, dst)))
            out[(src, dst)] = _LINK_GROUPS[key]
    return out


class GlooTransport:
    """gloo transfers of `rank`; `device` is where compute runs (CPU or a CUDA device
    whose tensors are staged through host memory). `groups`: the process group of each
    directed link (src, dst); the default group where one is missing. `tag_offset` is
    added to every tag (the runtime alternates it step by step, so a message of the next
    step never matches a receive of this one when steps run without a barrier)."""

    def __init__(self, rank: int, timeout: float, ledger: MemoryLedger, device: torch.device, transfers: int,
                 groups: dict[tuple[int, int], object] | None = None):
        self.rank, self.timeout, self.ledger, self.device = rank, timeout, ledger, device
        self.groups = groups or {}
        self.handed_over = 0.0  # seconds from starting to post each send until its data could leave
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, transfers), thread_name_prefix=f"rank{rank}-p2p")
        self.recvs: dict[int, _Pending] = {}
        self.sends: dict[int, _Pending] = {}
        self.done: list[Done] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.tag_offset = 0

    def post_recvs(self, items: list[tuple[Transfer, TensorSpec]]) -> None:
        for transfer, spec in items:
            buf = torch.empty(spec.shape, dtype=spec.dtype)
            pending = _Pending(transfer, buf, self.ledger.hold(buf), None, now())
            pending.work = dist.irecv(buf, transfer.peer, tag=transfer.edge + self.tag_offset,
                                      group=self.groups.get((transfer.peer, self.rank)))
            self.recvs[transfer.edge] = pending

    def take(self, transfer: Transfer) -> Tensor:
        """The received tensor (on the compute device); blocks until it has arrived."""
        pending = self.recvs.pop(transfer.edge)
        taken = now()
        try:
            pending.work.wait(timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            if _timed_out(exc):
                raise ExecutorError(f"rank {self.rank}: timed out after {self.timeout:g} s in {transfer.consumer} "
                                    f"waiting for {transfer.what()} from rank {transfer.peer}") from None
            raise ExecutorError(f"rank {self.rank}: {transfer.consumer} could not receive {transfer.what()} "
                                f"from rank {transfer.peer}: {_short(exc)}") from None
        self.done.append(Done(transfer, "recv", pending.posted, now(), taken))
        tensor = pending.tensor if self.device.type == "cpu" else pending.tensor.to(self.device)
        self.ledger.release(pending.key)
        return tensor

    def send_all(self, items: list[tuple[Transfer, Tensor]]) -> None:
        for transfer, tensor in items:
            host = tensor.detach().to("cpu").contiguous()
            pending = _Pending(transfer, host, self.ledger.hold(host), None, now())
            pending.work = dist.isend(host, transfer.peer, tag=transfer.edge + self.tag_offset,
                                      group=self.groups.get((self.rank, transfer.peer)))
            self.handed_over += now() - pending.posted
            with self.lock:
                self.sends[transfer.edge] = pending
            pending.future = self.pool.submit(self._await_send, pending)

    def _await_send(self, pending: _Pending) -> None:
        """Runs in a waiter thread: wait for the send, record it and release its buffer.
        All of it happens before the future completes (not in a done callback, which runs
        after `result()` has already woken `drain`), so a drained step holds no send buffer
        and has every send recorded."""
        t = pending.transfer
        exc = None
        try:
            pending.work.wait(timedelta(seconds=self.timeout))
        except Exception as caught:  # noqa: BLE001 - reported in `errors`, raised by `check`
            exc = caught
        end = now()
        with self.lock:
            if exc is None:
                self.done.append(Done(t, "send", pending.posted, end))
            elif _timed_out(exc):
                self.errors.append(f"rank {self.rank}: timed out after {self.timeout:g} s sending {t.what()} "
                                   f"to rank {t.peer}")
            else:
                self.errors.append(f"rank {self.rank}: could not send {t.what()} to rank {t.peer}: {_short(exc)}")
            self.sends.pop(t.edge, None)
        self.ledger.release(pending.key)
        pending.tensor = pending.work = None

    def check(self) -> None:
        """Raise the first error a send reported."""
        if self.errors:
            raise ExecutorError(self.errors[0])

    def drain(self) -> None:
        """Wait for every send of the step (each within the timeout)."""
        with self.lock:
            left = list(self.sends.values())
        deadline = now() + self.timeout
        for pending in left:
            try:
                pending.future.result(timeout=max(0.0, deadline - now()))
            except cf.TimeoutError:
                t = pending.transfer
                raise ExecutorError(f"rank {self.rank}: timed out after {self.timeout:g} s sending {t.what()} "
                                    f"to rank {t.peer}") from None
        self.check()
        if self.recvs:
            t = next(iter(self.recvs.values())).transfer
            raise ExecutorError(f"rank {self.rank}: {t.what()} from rank {t.peer} was posted but never used")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class NcclTransport:
    """NCCL transfers of `rank` on its CUDA `device` (one GPU per rank), over the
    default group."""

    def __init__(self, rank: int, timeout: float, ledger: MemoryLedger, device: torch.device, transfers: int,
                 groups: dict[tuple[int, int], object] | None = None):
        self.rank, self.timeout, self.ledger, self.device = rank, timeout, ledger, device
        self.recvs: dict[int, _Pending] = {}
        self.sends: dict[int, _Pending] = {}
        self.done: list[Done] = []
        self.handed_over = 0.0  # seconds from starting to post each send until its data could leave

    def post_recvs(self, items: list[tuple[Transfer, TensorSpec]]) -> None:
        if not items:
            return
        posted = now()
        pendings = [_Pending(t, torch.empty(s.shape, dtype=s.dtype, device=self.device), None, None, posted)
                    for t, s in items]
        ops = [dist.P2POp(dist.irecv, p.tensor, p.transfer.peer, tag=p.transfer.edge) for p in pendings]
        for p, work in zip(pendings, dist.batch_isend_irecv(ops)):
            p.work, p.key = work, self.ledger.hold(p.tensor)
            self.recvs[p.transfer.edge] = p

    def take(self, transfer: Transfer) -> Tensor:
        pending = self.recvs.pop(transfer.edge)
        pending.work.wait()  # orders the compute stream after the receive; the host goes on
        self._await([pending], "recv")
        self.ledger.release(pending.key)
        return pending.tensor

    def send_all(self, items: list[tuple[Transfer, Tensor]]) -> None:
        if not items:
            return
        posted = now()
        pendings = [_Pending(t, x.detach().contiguous(), None, None, posted) for t, x in items]
        ops = [dist.P2POp(dist.isend, p.tensor, p.transfer.peer, tag=p.transfer.edge) for p in pendings]
        works = dist.batch_isend_irecv(ops)
        self.handed_over += (now() - posted) * len(items)
        for p, work in zip(pendings, works):
            p.work, p.key = work, self.ledger.hold(p.tensor)
            self.sends[p.transfer.edge] = p

    def check(self) -> None:
        """Release the buffers of the sends that completed."""
        for edge, p in list(self.sends.items()):
            if p.work.is_completed():
                self._finish(self.sends.pop(edge), "send")

    def _finish(self, p: _Pending, lane: str) -> None:
        self.done.append(Done(p.transfer, lane, p.posted, now()))
        if lane == "send":
            self.ledger.release(p.key)
            p.tensor = p.work = None

    def _await(self, pendings: list[_Pending], lane: str) -> None:
        deadline = now() + self.timeout
        for p in pendings:
            while not p.work.is_completed():
                if now() > deadline:
                    t = p.transfer
                    verb = "sending" if lane == "send" else f"in {t.consumer} receiving"
                    raise ExecutorError(f"rank {self.rank}: timed out after {self.timeout:g} s {verb} "
                                        f"{t.what()} {'to' if lane == 'send' else 'from'} rank {t.peer}")
                time.sleep(1e-4)
            if lane == "recv":
                self.done.append(Done(p.transfer, lane, p.posted, now()))

    def drain(self) -> None:
        left = list(self.sends.values())
        self._await(left, "send")
        for p in left:
            self._finish(self.sends.pop(p.transfer.edge), "send")

    def close(self) -> None:
        pass


def _timed_out(exc: BaseException) -> bool:
    return "timed out" in str(exc).lower()


def _short(exc: BaseException) -> str:
    """The first line of a c10d/gloo error, without its source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split("] ", 1)[1] if text.startswith("[") and "] " in text else text
