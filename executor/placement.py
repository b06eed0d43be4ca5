"""Where a rank's threads run: its compute on its own cores, gloo's event loops elsewhere.

A local rank is pinned to an equal share of the job's cores (one core shared
round-robin where ranks outnumber them, `rank_cores`): its communication threads then
run beside its own compute rather than preempting another rank's, and the simulator
knows which ranks share a core (`HostSharing.pinned`).

One thread is the exception. Each gloo process group has an event-loop thread
(`gloo_tcp_loop`) that reads and writes the sockets. Its handler only *tries* the
connection's lock and returns when another thread holds it, and the socket stays ready,
so the loop calls it again at once: it spins until the holder lets go. On the rank's
own core the holder is usually the rank's main thread, preempted by the loop inside a
send or a receive post, and it cannot let go before the spinner's time slice ends: the
rank stalls 3-5 ms (a scheduler slice) with nothing to wait for. On another core the
holder runs on and releases the lock within microseconds. The process groups that carry
a step's data (one per directed link, one per data-parallel group) are created inside
`loops_off_own_cores`, which moves their loops to the job's cores other than the rank's
own, where each rank has cores of its own; where ranks outnumber the cores, every core
already runs two ranks and the loops stay. The default group's loop stays too: it serves
the barrier that starts each step, and a loop on a core busy with another rank's op held
a rank's start back by up to an op (docs/executor.md has the measurements).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

TRANSPORT_THREAD_NAMES = ("gloo_tcp_loop",)
"""Linux thread names of gloo's socket event loops (one per process group)."""

THREADS_ENV = "PIPESCHED_THREADS_PER_RANK"
"""Environment variable: intra-op threads per rank, at most the rank's share of the cores.
Unset: the whole share. Fewer threads than cores leave the rest of the rank's share to its
link groups' event loops, so they never preempt a compute thread (of its own or another rank)."""


@dataclass(frozen=True)
class _Job:
    cores: tuple[int, ...]  # the cores this job may use, as seen before the rank pinned itself
    ranks: int              # how many local ranks share them
    spare: tuple[int, ...] = ()  # this rank's own cores that run no compute thread (`THREADS_ENV`)


_job: _Job | None = None  # set by `pin_to_cores`


def host_cores() -> int:
    """How many cores the job's ranks share on this host."""
    if _job is not None:
        return len(_job.cores)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def job_cores() -> set[int]:
    """The cores the job's ranks share on this host, as this rank saw them before it
    pinned itself; empty where it was never pinned."""
    return set(_job.cores) if _job is not None else set()


def asked_threads() -> int | None:
    """Threads per rank asked for with `THREADS_ENV`; None where it is unset or empty.
    Raises ValueError on anything but a whole number >= 1."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{THREADS_ENV} must be a whole number >= 1, got {text!r}")
    return int(text)


def threads_per_rank(local_world: int) -> int:
    """Intra-op threads for each of `local_world` ranks on this host: its share of the cores
    (at least 1), or fewer where `THREADS_ENV` asks for fewer."""
    return threads_per_rank_of(max(1, host_cores() // max(1, local_world)))


def rank_cores(local_rank: int, local_world: int, cores: list[int]) -> list[int]:
    """The cores a rank is pinned to: an equal, disjoint share when there are at least
    as many cores as ranks, else one core shared round-robin."""
    share = len(cores) // local_world
    if share == 0:
        return [cores[local_rank % len(cores)]]
    return cores[local_rank * share:(local_rank + 1) * share]


def pin_to_cores(local_rank: int, local_world: int) -> None:
    """Pin this rank's process (and the threads it starts later) to its cores
    (`rank_cores`). With a core each, faster steps that the simulator predicts better
    (docs/executor.md has the measurements). With more ranks than cores, a fixed
    round-robin placement shares each core among known ranks, which the simulator
    models; left to the operating system, the ranks migrated between cores and ran
    slower than fair sharing predicts. Where affinity is not supported, nothing changes."""
    global _job
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    own = rank_cores(local_rank, local_world, cores)
    compute = own[:threads_per_rank_of(len(own))]
    _job = _Job(tuple(cores), local_world, tuple(own[len(compute):]))
    try:
        os.sched_setaffinity(0, compute)
    except OSError:
        pass


def threads_per_rank_of(share: int) -> int:
    """Compute threads for a rank with `share` cores of its own (`THREADS_ENV`, at most `share`)."""
    asked = asked_threads()
    return share if asked is None else max(1, min(share, asked))


def transport_threads() -> list[int]:
    """Thread ids of this process's gloo event loops (Linux; [] elsewhere)."""
    found = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name in TRANSPORT_THREAD_NAMES:
            found.append(int(tid))
    return found


def place_transport_threads(threads: Iterable[int], cores: set[int] | None = None) -> set[int]:
    """Pin the threads `threads` (ids, e.g. from `transport_threads`) to `cores`, by default
    the rank's own cores that run no compute thread (`THREADS_ENV`), else the job's cores
    other than this rank's own where each rank has cores of its own (module docstring).
    Returns the cores they were given; an empty set where nothing moved (the rank has
    every core of the job, ranks share cores, the rank was never pinned, or affinity is
    unsupported)."""
    if not hasattr(os, "sched_setaffinity") or _job is None:
        return set()
    if cores is None and _job.spare:
        cores = set(_job.spare)  # the rank's own cores that run no compute thread
    if cores is None:
        if _job.ranks > len(_job.cores):
            return set()  # every core runs two ranks already: a third thread there slowed steps
        cores = job_cores() - os.sched_getaffinity(0)
    if not cores:
        return set()
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile, or the cores are not ours
            pass
    return set(cores)


@contextmanager
def loops_off_own_cores() -> Iterator[None]:
    """Around the creation of process groups that carry a step's data (links, data-parallel
    groups): the gloo event loops started inside run on the job's other cores
    (`place_transport_threads`' default)."""
    before = set(transport_threads())
    yield
    place_transport_threads(set(transport_threads()) - before)
