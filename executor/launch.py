"""Starting the ranks: local processes, or this process under torchrun.

`launch_local` spawns one process per rank, watches them, and when one exits non-zero
kills the others (SIGTERM, then SIGKILL) and raises `ExecutorError` with the first error
a rank reported; it returns only after every process has been reaped. Under `torchrun`
(env:// rendezvous, any number of nodes) `run_here` runs this process's rank; torchrun
stops the others.

The launcher owns its ranks. The rendezvous store lives in the launcher's process (a
TCPStore on the loopback interface), so no file or folder is left behind whatever
happens. SIGTERM, SIGINT or SIGHUP to the launcher stop every rank and raise
`Interrupted` (a KeyboardInterrupt: the CLI prints one line, exit 128 + signal). If the
launcher is killed outright (SIGKILL), each rank dies with it: on Linux the kernel sends
it SIGKILL (prctl PR_SET_PDEATHSIG), and everywhere a watchdog thread sees the
launcher's end of the control pipe close and exits the rank.

Each rank gets `cores // ranks on this host` intra-op threads (at least 1) and one
inter-op thread, so ranks do not oversubscribe the cores; it is pinned to its share of
the cores, the event loops of the gloo groups that carry its data run off them
(`executor.placement`), and its allocator keeps freed memory (`keep_freed_memory`).
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .comm import ExecutorError, HostOutOfMemory
from .placement import asked_threads, pin_to_cores, threads_per_rank

BACKENDS = ("gloo", "nccl", "gloo-cuda")
KILL_GRACE_S = 2.0
ERROR_GRACE_S = 1.0  # after a first error, how long to wait for the others' reports
CONSEQUENCES = ("Connection closed by peer", "Connection reset", "lost rank", "Broken pipe")
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # what a job scheduler, Ctrl-C or a closed terminal sends
RANK_FOOTPRINT_BYTES = 256 << 20
"""Memory one local rank needs before its model: a Python process with torch and gloo
imported, rounded up (docs/limits.md). `check_launchable` refuses more ranks than
the available memory holds at this size."""
MEMORY_POLL_S = 0.05
"""How often the launcher reads the host's available memory while ranks run."""
MEMORY_RESERVE_FRACTION = 0.03
"""The share of the host's memory (at least 256 MiB) the launcher keeps free: when less
is available it stops the ranks with an error rather than let the kernel's out-of-memory
killer pick a process (theirs or anyone's)."""
MAX_LOCAL_RANKS = 1024
"""The most ranks one launcher starts on this host, whatever the memory (each is a
process with its own threads and sockets to every peer)."""


class Interrupted(KeyboardInterrupt):
    """The launcher was told to stop (SIGTERM, SIGINT or SIGHUP); its ranks are stopped
    and reaped. `signum` is the signal; a command exits with 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; every rank was stopped")
        self.signum = signum


@dataclass(frozen=True)
class RankContext:
    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str          # gloo, nccl or gloo-cuda
    device: torch.device
    timeout: float        # seconds


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_launchable(ranks: int) -> None:
    """ValueError when `ranks` local processes cannot be started on this host: more than
    MAX_LOCAL_RANKS, more than the available memory holds (RANK_FOOTPRINT_BYTES each), or
    more than the process limit (RLIMIT_NPROC) allows; or a bad PIPESCHED_THREADS_PER_RANK.
    Checked before anything is built."""
    asked_threads()  # the ranks read it; refused here, before they start
    if ranks > MAX_LOCAL_RANKS:
        raise ValueError(f"{ranks:,} ranks cannot be launched on one host: pipesched starts at most "
                         f"{MAX_LOCAL_RANKS:,} local processes (use torchrun across hosts)")
    memory = available_memory()
    if memory is not None and ranks * RANK_FOOTPRINT_BYTES > memory:
        raise ValueError(f"{ranks:,} ranks cannot be launched here: each needs about "
                         f"{RANK_FOOTPRINT_BYTES >> 20} MiB before its model, and {memory >> 20:,} MiB are "
                         f"available (at most {memory // RANK_FOOTPRINT_BYTES:,} ranks)")
    try:
        import resource  # POSIX only
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        unlimited = resource.RLIM_INFINITY
    except (ImportError, AttributeError):
        return
    if soft != unlimited and 0 <= soft < ranks:
        raise ValueError(f"{ranks:,} ranks cannot be launched here: the process limit (ulimit -u) is {soft:,}")


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
    each reallocation page-faults afresh, and an op's time depends on what ran before
    it (docs/executor.md). Like a GPU's caching allocator, the rank keeps what
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


STARTUP_TIMEOUT_S = 120.0
"""The least time ranks get to meet and connect (spawn, import torch, the gloo mesh): on a
loaded machine that alone can take longer than a short --timeout, which bounds the
schedule's waits (enforced by the transport), not process start-up."""


def startup_timeout(timeout: float) -> timedelta:
    return timedelta(seconds=max(timeout, STARTUP_TIMEOUT_S))


def _init(ctx: RankContext, init_method: str | None = None, store: Any = None) -> None:
    dist.init_process_group("nccl" if ctx.backend == "nccl" else "gloo", init_method=init_method, store=store,
                            rank=ctx.rank, world_size=ctx.world, timeout=startup_timeout(ctx.timeout))


def _describe(rank: int, exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ExecutorError) or text.startswith(f"rank {rank}"):
        return text
    return f"rank {rank}: {type(exc).__name__}: {text}"


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, control) -> None:
    """Make this rank exit as soon as the launcher (`parent`, its pid) is gone: the kernel
    kills it when the launcher dies (Linux), and a watchdog thread exits it when the
    launcher's end of `control` closes (everywhere, also if the launcher died before
    the kernel was told)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        try:
            control.recv()  # the launcher never sends: this returns only when it is gone
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="pipesched-launcher-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before any of that was in place
        os._exit(1)


class ModelCodeError(ExecutorError):
    """The model's own code failed in a rank (its unpickling raised, its check hung past
    --timeout): bad input, exit status 2."""

    exit_status = 2


class _Report(str):
    """A rank's error message that says it is the model's fault (`ModelCodeError`)."""


class _Deferred:
    """A rank's job and arguments, pickled when the rank is started (as spawn would, with
    torch's shared-memory reductions) but unpickled by the rank itself, inside `_child`:
    an object whose unpickling fails (a model's __setstate__) is then the rank's one-line
    error, not a traceback from multiprocessing's bootstrap."""

    def __init__(self, value: Any = None, data: bytes | None = None, label: str = "the job"):
        self.value, self.data, self.label = value, data, label

    def __reduce__(self):
        from multiprocessing.reduction import ForkingPickler
        return (_Deferred, (None, bytes(ForkingPickler.dumps(self.value)), self.label))

    def load(self, rank: int) -> Any:
        if self.data is None:
            return self.value
        try:
            return pickle.loads(self.data)
        except Exception as exc:  # noqa: BLE001 - whatever the unpickled objects raise
            raise ModelCodeError(f"rank {rank}: {self.label} cannot be unpickled in the rank: "
                                 f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None


def _label(args: tuple) -> str:
    """What a rank's messages call the job's model: "the model NAME" for a PipelineModel."""
    names = [getattr(a, "name", "") for a in args if type(a).__name__ == "PipelineModel"]
    return f"the model {names[0]}" if names and names[0] else "the job"


_REPORT: tuple[int, Any] | None = None
"""(rank, report connection) of the local rank this process runs, for `deadline`."""


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """In a rank: when the block (the model's own code, e.g. the model check) runs past
    `seconds`, say so (to the launcher, or on stderr under torchrun) and exit the rank;
    the launcher then stops the others. Its waits are bounded by the transport's timeout,
    but a hung forward waits on nothing."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        message = f"{what} did not finish within --timeout {seconds:g} s"
        if _REPORT is not None:
            rank, report = _REPORT
            try:
                report.send(("error", _Report(f"rank {rank}: {message}")))
            except OSError:
                pass
        else:
            print(f"pipesched: error: {message}", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="pipesched-deadline", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _child(rank: int, world: int, backend: str, timeout: float, store_address: tuple[str, int], parent: int,
           control, job: Callable[..., Any], args: tuple, report) -> None:
    """One rank: send ("ok", value) or ("error", message) through `report`, once."""
    global _REPORT
    _REPORT = (rank, report)
    die_with_parent(parent, control)
    # the launcher stops the ranks itself; a terminal's Ctrl-C or hang-up reaches the
    # whole process group, and the ranks must not report it as their own failure
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    try:
        configure_process(world, rank)
        if isinstance(job, _Deferred):
            job, args = job.load(rank)
        ctx = RankContext(rank, world, rank, world, backend, rank_device(backend, rank), timeout)
        host, port = store_address
        store = dist.TCPStore(host, port, world, is_master=False, timeout=startup_timeout(timeout))
        _init(ctx, store=store)
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
        try:
            text = _describe(rank, exc)
            report.send(("error", _Report(text) if isinstance(exc, ModelCodeError) else text))
        except OSError:  # the launcher is gone
            pass
        sys.stderr.flush()
        # waiter threads may still block in gloo; do not let interpreter shutdown join them
        os._exit(1)
    # Interpreter shutdown can abort here ("terminate called without an active exception":
    # a C++ thread torch's pipelining runtime leaves joinable, rarely: docs/executor.md);
    # the rank's work is reported and its group destroyed, so skip the finalizers.
    os._exit(0)


class _StopSignals:
    """Whether a stop signal may still raise: once one has, or once the clean-up has
    begun, later ones are recorded and the clean-up finishes undisturbed."""

    def __init__(self) -> None:
        self.armed = True
        self.raised = False
        self.received: int | None = None

    def disarm(self) -> None:
        self.armed = False


@contextmanager
def stop_signals_raise() -> Iterator[_StopSignals]:
    """While the ranks run, SIGTERM, SIGINT and SIGHUP raise `Interrupted` in the
    launcher, once; `disarm()` the yielded object before cleaning up. Outside the main
    thread signals cannot be handled and nothing changes."""
    state = _StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if state.received is None:
            state.received = signum
        if state.armed:
            state.armed, state.raised = False, True
            raise Interrupted(signum)

    previous = {}
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            num = getattr(signal, name)
            previous[num] = signal.signal(num, handler)
    try:
        yield state
    finally:
        for num, old in previous.items():
            signal.signal(num, old)
    if state.received is not None and not state.raised:
        raise Interrupted(state.received)  # it came during the clean-up: honour it now that it is done


MAIN_GUARD_EXIT = 86  # a rank's exit status: it re-ran a script that launches at import time


def check_main_module() -> None:
    """In a rank that spawn is still starting (it imports the user's main module) and
    that module launches ranks at import time (no `if __name__ == "__main__":` guard):
    exit quietly with MAIN_GUARD_EXIT, which the launcher turns into one clear line;
    otherwise multiprocessing fails with a RuntimeError deep in its bootstrap."""
    if getattr(mp.process.current_process(), "_inheriting", False):  # set only while spawn prepares
        os._exit(MAIN_GUARD_EXIT)


_NO_MAIN_GUARD = ("pipesched launches its ranks as new Python processes that import your script's main "
                  "module; put the code that calls pipesched under `if __name__ == \"__main__\":`")


def launch_local(job: Callable[..., Any], args: tuple, ranks: int, backend: str = "gloo",
                 timeout: float = 300.0) -> Any:
    """Run `job(ctx, *args)` on `ranks` local processes; return rank 0's value.

    `job` and `args` must be picklable (module-level functions, plain data). SIGTERM,
    SIGINT or SIGHUP meanwhile stop every rank and raise `Interrupted`."""
    check_main_module()
    check_backend(backend, ranks)
    check_launchable(ranks)
    context = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, ranks, is_master=True, timeout=startup_timeout(timeout),
                          wait_for_workers=False)
    address = ("127.0.0.1", store.port)
    reports = [context.Pipe(duplex=False) for _ in range(ranks)]
    controls = [context.Pipe(duplex=False) for _ in range(ranks)]  # (rank reads, launcher holds)
    procs = [context.Process(target=_child, name=f"pipesched-rank{r}", daemon=True,
                             args=(r, ranks, backend, timeout, address, os.getpid(), controls[r][0],
                                   _Deferred((job, args), label=_label(args)), (), reports[r][1]))
             for r in range(ranks)]
    with stop_signals_raise() as signals:
        try:
            for p in procs:
                p.start()
            for (_, send_end), (read_end, _) in zip(reports, controls):
                send_end.close()  # so a dead child reads as end-of-file
                read_end.close()  # so only the ranks hold their ends of the control pipes
            return _supervise(procs, [r for r, _ in reports])
        finally:
            signals.disarm()
            _stop(procs)
            for _, hold in controls:
                hold.close()
            del store


def _supervise(procs: list, readers: list) -> Any:
    """Collect each rank's report; on a failure raise with the root cause."""
    reports: dict[int, tuple[str, Any]] = {}
    open_readers = dict(enumerate(readers))
    failed_at = None
    reserve = memory_reserve()
    while open_readers:
        wait = 1.0 if failed_at is None else max(0.0, failed_at + ERROR_GRACE_S - time.monotonic())
        ready = mp.connection.wait(list(open_readers.values()), timeout=min(wait, MEMORY_POLL_S))
        if failed_at is None and reserve is not None:
            check_memory_left(procs, reserve)
        for rank, reader in list(open_readers.items()):
            if reader not in ready:
                continue
            try:
                reports[rank] = reader.recv()
            except EOFError:
                code = _exit_code(procs[rank])
                if code == MAIN_GUARD_EXIT:
                    raise ExecutorError(_NO_MAIN_GUARD) from None
                reports[rank] = ("error", _died(rank, code))
            del open_readers[rank]
            if reports[rank][0] == "error" and failed_at is None:
                failed_at = time.monotonic()
        if failed_at is not None and (not ready or time.monotonic() >= failed_at + ERROR_GRACE_S):
            break
    errors = [msg for status, msg in reports.values() if status == "error"]
    if errors:
        # a rank that lost its peer reports the loss; the peer's own error is the cause
        causes = [m for m in errors if not any(s in m for s in CONSEQUENCES)]
        cause = (causes or errors)[0]
        raise (ModelCodeError if isinstance(cause, _Report) else ExecutorError)(str(cause))
    for p in procs:
        p.join(10 * KILL_GRACE_S)
    bad = next((r for r, p in enumerate(procs) if p.exitcode not in (0, None)), None)
    if bad is not None:
        raise ExecutorError(f"rank {bad} exited with status {procs[bad].exitcode} after finishing")
    return reports[0][1]


def memory_reserve() -> int | None:
    """Bytes of memory the launcher keeps free (`MEMORY_RESERVE_FRACTION` of the host's,
    at least 256 MiB); None where the host's memory is unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return max(256 << 20, int(MEMORY_RESERVE_FRACTION * total))


def resident_bytes(pid: int) -> int:
    """Resident memory of process `pid` in bytes (Linux); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_memory_left(procs: list, reserve: int) -> None:
    """HostOutOfMemory when the host has less than `reserve` bytes available while the
    ranks `procs` run (the caller then stops them)."""
    left = available_memory()
    if left is None or left >= reserve:
        return
    held = sum(resident_bytes(p.pid) for p in procs if p.pid is not None)
    raise HostOutOfMemory(f"out of memory: the {len(procs)} ranks held {held / 2**30:,.1f} GiB and "
                          f"{left / 2**30:,.2f} GiB was left on this host, so they were stopped (a smaller "
                          "--hidden, fewer --layers-per-stage, fewer microbatches or fewer schedules in one "
                          "command need less)")


def _died(rank: int, code: int | None) -> str:
    """What a rank that ended without reporting died of, in one line."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (the kernel's out-of-memory killer sends it when the host runs out of memory)" \
            if -code == signal.SIGKILL else ""
        return f"rank {rank} was killed by {name} without reporting{why}"
    return f"rank {rank} exited with status {code} without reporting"


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
