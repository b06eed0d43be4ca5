"""Where a rank's threads run: pinned compute, the event loops of the links off its own cores."""
from __future__ import annotations

import ctypes
import os
import threading

import pytest

from pipesched.executor import placement
from pipesched.executor.placement import loops_off_own_cores, place_transport_threads, rank_cores, transport_threads

LINUX_AFFINITY = hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def test_rank_cores_share_the_cores_evenly_or_round_robin():
    cores = [0, 1, 2, 3]
    assert [rank_cores(r, 2, cores) for r in range(2)] == [[0, 1], [2, 3]]
    assert [rank_cores(r, 4, cores) for r in range(4)] == [[0], [1], [2], [3]]
    assert [rank_cores(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]


def _named_thread(name: bytes, ready: threading.Event, stop: threading.Event) -> None:
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME: as gloo names its loop
    ready.set()
    stop.wait(30)


def _start_named(names: list[bytes], stop: threading.Event) -> list[threading.Thread]:
    ready = [threading.Event() for _ in names]
    threads = [threading.Thread(target=_named_thread, args=(name, r, stop), daemon=True)
               for name, r in zip(names, ready)]
    for t in threads:
        t.start()
    for r in ready:
        assert r.wait(10)
    return threads


@pytest.mark.skipif(not LINUX_AFFINITY or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 cores")
def test_only_loops_started_inside_the_block_leave_the_rank_core(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(placement, "_job", placement._Job(tuple(cores), 2))
    stop = threading.Event()
    earlier = _start_named([b"gloo_tcp_loop"], stop)  # as the default group's loop, before
    later: list = []

    def as_a_rank_pinned_to_the_first_core():  # affinity is per thread: this one plays the rank
        os.sched_setaffinity(0, {cores[0]})
        with loops_off_own_cores():  # as creating the link groups
            later.extend(_start_named([b"gloo_tcp_loop", b"other_worker"], stop))

    rank = threading.Thread(target=as_a_rank_pinned_to_the_first_core)
    rank.start()
    rank.join()
    try:
        assert sorted(transport_threads()) == sorted([earlier[0].native_id, later[0].native_id])
        assert os.sched_getaffinity(later[0].native_id) == set(cores[1:])
        assert os.sched_getaffinity(earlier[0].native_id) == set(cores)  # started before the block: untouched
        assert os.sched_getaffinity(later[1].native_id) == {cores[0]}  # not gloo's loop: stays
    finally:
        stop.set()


def test_nothing_moves_in_a_process_that_was_never_pinned(monkeypatch):
    monkeypatch.setattr(placement, "_job", None)
    assert place_transport_threads([threading.get_native_id()]) == set()


@pytest.mark.skipif(not LINUX_AFFINITY, reason="needs Linux")
def test_nothing_moves_where_ranks_share_cores(monkeypatch):
    cores = tuple(sorted(os.sched_getaffinity(0)))
    monkeypatch.setattr(placement, "_job", placement._Job(cores, 2 * len(cores)))
    assert place_transport_threads([threading.get_native_id()]) == set()


@pytest.mark.skipif(not LINUX_AFFINITY, reason="needs Linux")
def test_nothing_moves_when_the_rank_has_every_core(monkeypatch):
    monkeypatch.setattr(placement, "_job", placement._Job(tuple(sorted(os.sched_getaffinity(0))), 1))
    assert place_transport_threads([threading.get_native_id()]) == set()


def _loop_affinities(ctx) -> tuple:
    from pipesched.executor.comm import link_groups

    default = transport_threads()
    link_groups([(0, 1), (1, 0)])
    links = sorted(set(transport_threads()) - set(default))
    return (sorted(os.sched_getaffinity(0)), [sorted(os.sched_getaffinity(t)) for t in default],
            [sorted(os.sched_getaffinity(t)) for t in links])


@pytest.mark.distributed
@pytest.mark.skipif(not LINUX_AFFINITY or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 cores")
def test_launched_ranks_run_their_link_loops_on_the_other_cores():
    pytest.importorskip("torch")
    from pipesched.executor.launch import launch_local

    own, default, links = launch_local(_loop_affinities, (), 2, timeout=120)  # rank 0's
    cores = sorted(os.sched_getaffinity(0))
    assert own == rank_cores(0, 2, cores)
    assert default and all(loop == own for loop in default)  # the default group's: the step's barrier
    assert len(links) == 2 and all(loop == sorted(set(cores) - set(own)) for loop in links)


def test_fewer_threads_asked_leave_the_rest_of_the_share_to_the_loops(monkeypatch):
    monkeypatch.setattr(placement, "host_cores", lambda: 16)
    monkeypatch.delenv(placement.THREADS_ENV, raising=False)
    assert placement.threads_per_rank(2) == 8
    monkeypatch.setenv(placement.THREADS_ENV, "3")
    assert placement.threads_per_rank(2) == 3
    assert placement.threads_per_rank(8) == 2  # never more than the share
    monkeypatch.setenv(placement.THREADS_ENV, "0")
    with pytest.raises(ValueError, match="whole number"):
        placement.threads_per_rank(2)


@pytest.mark.skipif(not LINUX_AFFINITY, reason="needs Linux")
def test_a_rank_with_spare_cores_puts_its_loops_there(monkeypatch):
    cores = tuple(sorted(os.sched_getaffinity(0)))
    monkeypatch.setattr(placement, "_job", placement._Job(cores, 1, spare=cores[-1:]))
    try:
        assert place_transport_threads([threading.get_native_id()]) == {cores[-1]}
        assert os.sched_getaffinity(0) == {cores[-1]}
    finally:
        os.sched_setaffinity(0, set(cores))


def test_a_bad_thread_count_is_refused_before_any_rank_starts(monkeypatch):
    pytest.importorskip("torch")
    from pipesched.executor.launch import check_launchable

    monkeypatch.setenv(placement.THREADS_ENV, "two")
    with pytest.raises(ValueError, match="PIPESCHED_THREADS_PER_RANK must be a whole number >= 1, got 'two'"):
        check_launchable(2)
