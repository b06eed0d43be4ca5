"""Starting the ranks: local processes, or this process under torchrun.

`launch_local` spawns one process per rank (rendezvous through a file in a temporary
directory), watches them, and when one exits non-zero kills the others (SIGTERM, then
SIGKILL) and raises `ExecutorError` with the first error a rank reported; it returns
only after every process has been reaped. Under `torchrun` (env:// rendezvous, any
number of nodes) `run_here` runs this process's rank; torchrun stops the others.

Each rank gets `cores // ranks on this host` intra-op threads (at least 1) and one
inter-op thread, so ranks do not oversubscribe the cores, and an allocator that keeps
freed memory (`keep_freed_memory`).
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from .comm import ExecutorError

BACKENDS = ("gloo", "nccl", "gloo-cuda")
KILL_GRACE_S = 2.0
ERROR_GRACE_S = 1.0  # after a first error, how long to wait for the others' reports
CONSEQUENCES = ("Connection closed by peer", "Connection reset", "lost rank", "Broken pipe")


@dataclass(frozen=True)
class RankContext:
    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str          # gloo, nccl or gloo-cuda
    device: torch.device
    timeout: float        # seconds


def check_backend(backend: str, local_world: int) -> None:
    """Raise ValueError unless `backend` can run `local_world` ranks on this host."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; backends are {', '.join(BACKENDS)}")
    if backend == "gloo":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"backend {backend} needs CUDA, and this machine has no usable GPU")
    if backend == "nccl" and torch.cuda.device_count() < local_world:
        raise ValueError(f"backend nccl needs one GPU per rank: {local_world} ranks, "
                         f"{torch.cuda.device_count()} GPUs (gloo-cuda shares GPUs between ranks)")


def rank_device(backend: str, local_rank: int) -> torch.device:
    if backend == "gloo":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


_HOST_CORES: list[int] = []  # the cores this job may use, as seen before a rank pinned itself


def host_cores() -> int:
    """How many cores the job's ranks share on this host."""
    if _HOST_CORES:
        return len(_HOST_CORES)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_rank(local_world: int) -> int:
    return max(1, host_cores() // max(1, local_world))


def rank_cores(local_rank: int, local_world: int, cores: list[int]) -> list[int]:
    """The cores a rank is pinned to: an equal, disjoint share when there are at least
    as many cores as ranks, else one core shared round-robin."""
    share = len(cores) // local_world
    if share == 0:
        return [cores[local_rank % len(cores)]]
    return cores[local_rank * share:(local_rank + 1) * share]


def pin_to_cores(local_rank: int, local_world: int) -> None:
    """Pin this rank's process (and the threads it starts later) to its cores
    (`rank_cores`). With a core each, a rank's communication threads run beside its own
    compute rather than preempting another rank's (measured here, 2 ranks on 2 cores:
    1F1B 10 % faster, and its timeline predicted within 2 % instead of 6 %). With more
    ranks than cores, a fixed round-robin placement shares each core among known ranks,
    which the simulator models (`HostSharing.pinned`); left to the operating system,
    the ranks migrated between cores and ran 10 % slower than fair sharing predicts.
    Where affinity is not supported, nothing changes."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    _HOST_CORES[:] = cores
    try:
        os.sched_setaffinity(0, rank_cores(local_rank, local_world, cores))
    except OSError:
        pass


def configure_process(local_world: int, local_rank: int | None = None) -> None:
    """A rank's process: its share of the cores (pinned when `local_rank` is given),
    and an allocator that keeps memory."""
    if local_rank is not None:
        pin_to_cores(local_rank, local_world)
    torch.set_num_threads(threads_per_rank(local_world))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already ran in this process
        pass
    keep_freed_memory()


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the system.

    A pipeline step frees and reallocates the same tensors again and again (weight
    gradients, activations). By default glibc unmaps large blocks and trims the heap, so
    each reallocation page-faults afresh: measured here, a W took 5-8 ms instead of 4,
    depending on what ran before it. Like a GPU's caching allocator, the rank keeps what
    it freed (blocks up to 32 MiB from the heap, no trimming). Returns False where the C
    library is not glibc (nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20) and mallopt(m_trim_threshold, (1 << 31) - 1)
                and mallopt(m_top_pad, 64 << 20))


def _init(ctx: RankContext, init_method: str) -> None:
    dist.init_process_group("nccl" if ctx.backend == "nccl" else "gloo", init_method=init_method,
                            rank=ctx.rank, world_size=ctx.world, timeout=timedelta(seconds=ctx.timeout))


def _describe(rank: int, exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ExecutorError) or text.startswith(f"rank {rank}"):
        return text
    return f"rank {rank}: {type(exc).__name__}: {text}"


def _child(rank: int, world: int, backend: str, timeout: float, init_method: str,
           job: Callable[..., Any], args: tuple, report) -> None:
    """One rank: send ("ok", value) or ("error", message) through `report`, once."""
    try:
        configure_process(world, rank)
        ctx = RankContext(rank, world, rank, world, backend, rank_device(backend, rank), timeout)
        _init(ctx, init_method)
        value = job(ctx, *args)
        # nobody tears the group down while a peer may still be finishing its last transfer
        dist.barrier()
        report.send(("ok", value if rank == 0 else None))
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        if os.environ.get("PIPESCHED_DEBUG"):
            traceback.print_exc()
        report.send(("error", _describe(rank, exc)))
        sys.stderr.flush()
        # waiter threads may still block in gloo; do not let interpreter shutdown join them
        os._exit(1)
    # Interpreter shutdown can abort here ("terminate called without an active exception":
    # a C++ thread torch's pipelining runtime leaves joinable, about one launch in 40);
    # the rank's work is reported and its group destroyed, so skip the finalizers.
    os._exit(0)


def launch_local(job: Callable[..., Any], args: tuple, ranks: int, backend: str = "gloo",
                 timeout: float = 300.0) -> Any:
    """Run `job(ctx, *args)` on `ranks` local processes; return rank 0's value.

    `job` and `args` must be picklable (module-level functions, plain data)."""
    check_backend(backend, ranks)
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pipesched-") as tmp:
        init_method = f"file://{Path(tmp) / 'rendezvous'}"
        pipes = [context.Pipe(duplex=False) for _ in range(ranks)]
        procs = [context.Process(target=_child, name=f"pipesched-rank{r}", daemon=True,
                                 args=(r, ranks, backend, timeout, init_method, job, args, pipes[r][1]))
                 for r in range(ranks)]
        try:
            for p in procs:
                p.start()
            for _, send_end in pipes:
                send_end.close()  # so a dead child reads as end-of-file
            return _supervise(procs, [r for r, _ in pipes])
        finally:
            _stop(procs)


def _supervise(procs: list, readers: list) -> Any:
    """Collect each rank's report; on a failure raise with the root cause."""
    reports: dict[int, tuple[str, Any]] = {}
    open_readers = dict(enumerate(readers))
    failed_at = None
    while open_readers:
        wait = 1.0 if failed_at is None else max(0.0, failed_at + ERROR_GRACE_S - time.monotonic())
        ready = mp.connection.wait(list(open_readers.values()), timeout=wait)
        for rank, reader in list(open_readers.items()):
            if reader not in ready:
                continue
            try:
                reports[rank] = reader.recv()
            except EOFError:
                reports[rank] = ("error", f"rank {rank} exited with status {_exit_code(procs[rank])} "
                                          "without reporting")
            del open_readers[rank]
            if reports[rank][0] == "error" and failed_at is None:
                failed_at = time.monotonic()
        if failed_at is not None and (not ready or time.monotonic() >= failed_at + ERROR_GRACE_S):
            break
    errors = [msg for status, msg in reports.values() if status == "error"]
    if errors:
        # a rank that lost its peer reports the loss; the peer's own error is the cause
        causes = [m for m in errors if not any(s in m for s in CONSEQUENCES)]
        raise ExecutorError((causes or errors)[0])
    for p in procs:
        p.join(10 * KILL_GRACE_S)
    bad = next((r for r, p in enumerate(procs) if p.exitcode not in (0, None)), None)
    if bad is not None:
        raise ExecutorError(f"rank {bad} exited with status {procs[bad].exitcode} after finishing")
    return reports[0][1]


def _exit_code(proc) -> int | None:
    proc.join(KILL_GRACE_S)
    return proc.exitcode


def _stop(procs: list) -> None:
    """Terminate and reap every process still running."""
    procs = [p for p in procs if p.pid is not None]  # a failed start leaves nothing to reap
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(KILL_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def under_torchrun() -> bool:
    """Whether this process is one rank started by torchrun (env:// rendezvous)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"))


def run_here(job: Callable[..., Any], args: tuple, backend: str = "gloo", timeout: float = 300.0) -> Any:
    """Run this process's rank under torchrun; return the job's value (None off rank 0).
    A failure prints one line naming the rank and exits 1 at once (torchrun then stops
    the other ranks)."""
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", 0))
    local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    try:
        check_backend(backend, local_world)
        configure_process(local_world, local_rank)
        ctx = RankContext(rank, world, local_rank, local_world, backend, rank_device(backend, local_rank), timeout)
        _init(ctx, "env://")
        value = job(ctx, *args)
        dist.destroy_process_group()
        return value
    except BaseException as exc:  # noqa: BLE001
        if os.environ.get("PIPESCHED_DEBUG"):
            traceback.print_exc()
        print(f"pipesched: error: {_describe(rank, exc)}", file=sys.stderr, flush=True)
        os._exit(1)
