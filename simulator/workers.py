"""Independent jobs on the host's cores: forked worker processes, results in order.

The planner's candidates at one microbatch count and recompute setting do not depend on
those at another, so `plan` hands each such group to a worker. Workers are forked, so
they see the caller's job and items without pickling them and without a `__main__`
guard; only results travel back. They ignore Ctrl-C (the caller receives it and stops
them), die with the caller (Linux: PR_SET_PDEATHSIG), and are terminated whenever the
caller leaves early (an error, Ctrl-C, SIGTERM). Off Linux, where one process is
asked for, there is one item, or the caller is itself a worker, the jobs run here in turn.
Results come back in the items' order whatever order the workers finish in.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import multiprocessing
import os
import signal
import sys
from typing import Callable, Sequence, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_PR_SET_PDEATHSIG = 1
_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what stops a command (pipesched.cli)
GC_YOUNG_OBJECTS = 100_000  # a worker's first collector generation (Python's default: 700)
_jobs: dict[int, tuple[Callable, Sequence, int]] = {}  # what a forked worker runs, by token; the caller's pid


def cores() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() elsewhere), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether workers can be forked here: on Linux (elsewhere forking a process with
    threads is not safe), and not from a worker itself (a daemon process may not have
    children)."""
    return sys.platform.startswith("linux") and not multiprocessing.current_process().daemon


def run_in_order(job: Callable[[Item], Result], items: Sequence[Item], processes: int,
                 weights: Sequence[float] | None = None,
                 finished: Callable[[int, Result], None] | None = None) -> list[Result]:
    """[job(item) for item in items], on up to `processes` forked workers. `weights`
    (one per item, any unit): the heaviest are started first, so the last to finish are
    short. `finished(index, result)` is called here as each result arrives. An exception
    in a job is raised here (the other workers are stopped)."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes!r}")
    processes = min(processes, len(items))
    if processes <= 1 or not can_fork():
        return [_done(finished, i, job(item)) for i, item in enumerate(items)]
    order = sorted(range(len(items)), key=lambda i: -weights[i]) if weights is not None else list(range(len(items)))
    token = id(items)
    _jobs[token] = (job, items, os.getpid())
    results: dict[int, Result] = {}
    # A signal that reached a worker before it set its own handlers would end it with a
    # traceback: they are held back while the workers are forked, each worker lets them
    # through once its handlers are set, and here once the pool will stop them on leaving.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        try:
            pool = multiprocessing.get_context("fork").Pool(processes, initializer=_worker_starts, initargs=(token,))
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        with pool:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            for i, result in pool.imap_unordered(_run_one, [(token, i) for i in order]):
                results[i] = _done(finished, i, result)
    finally:  # the pool's exit has terminated its workers, on success or not
        del _jobs[token]
    return [results[i] for i in range(len(items))]


def _done(finished: Callable[[int, Result], None] | None, i: int, result: Result) -> Result:
    if finished is not None:
        finished(i, result)
    return result


def _run_one(task: tuple[int, int]) -> tuple[int, object]:
    token, i = task
    job, items, _ = _jobs[token]
    return i, job(items[i])


def _worker_starts(token: int) -> None:
    """In each worker: Ctrl-C is the caller's to handle; SIGTERM and SIGHUP end the worker
    (not the caller's handlers, inherited by the fork); and it dies with the caller."""
    gc.freeze()  # what the fork inherited is not looked at again by the collector (nor its pages touched)
    # searches allocate millions of short-lived tuples and few cycles: collect rarely
    gc.set_threshold(GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for num in _STOPS - {signal.SIGINT}:
        signal.signal(num, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # held back by the caller while forking
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != _jobs[token][2]:  # the caller died before prctl took hold
        os._exit(1)
