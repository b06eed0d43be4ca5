"""Searching on several processes: the same plan, and no worker outlives its caller."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import pipesched as ps
from pipesched.simulator import workers
from pipesched.simulator.workers import run_in_order

BIG_PLAN = ["plan", "-p", "16", "-m", "16..128", "--f", "12ms", "--b", "14ms", "--w", "10ms",
            "--activation-memory", "2GiB", "--param-bytes", "20GiB", "--memory-limit", "40GiB", "--processes", "2"]


def _square_or_fail(x: int) -> int:
    if x == 3:
        raise ValueError("three is refused")
    return x * x


def test_results_come_back_in_the_items_order_whoever_finishes_first():
    seen = []
    got = run_in_order(lambda x: (time.sleep(0.05 * (5 - x)), os.getpid(), x * x)[1:], list(range(5)), 2,
                       weights=[1, 5, 2, 4, 3], finished=lambda i, r: seen.append(i))
    assert [r[1] for r in got] == [0, 1, 4, 9, 16]
    assert sorted(seen) == list(range(5)) and os.getpid() not in dict(got)  # run by workers, not here


def test_a_failing_job_raises_here_and_one_process_runs_here():
    with pytest.raises(ValueError, match="three is refused"):
        run_in_order(_square_or_fail, [1, 2, 3, 4], 2)
    assert run_in_order(lambda x: (os.getpid(), x), [1, 2], 1) == [(os.getpid(), 1), (os.getpid(), 2)]
    with pytest.raises(ValueError, match="processes must be"):
        run_in_order(abs, [1], 0)
    assert workers._jobs == {}


def test_a_plan_on_two_processes_is_the_plan_on_one():
    costs = ps.uniform_costs(12e-3, 14e-3, 10e-3, activation_bytes=2 ** 27, bandwidth=50e9,
                             activation_memory=2 ** 31, param_bytes=20 * 2 ** 30)

    def rows(plan):
        return [(c.label, c.microbatches, c.v, c.error, c.p95,
                 c.result and (c.result.makespan, c.result.peak_bytes, c.result.fits)) for c in plan.candidates]

    calls = []
    one = ps.plan(4, [4, 8, 16], costs=costs, memory_limit=40 * 2 ** 30, processes=1)
    two = ps.plan(4, [4, 8, 16], costs=costs, memory_limit=40 * 2 ** 30, processes=2,
                  progress=lambda done, what: calls.append(done))
    assert rows(one) == rows(two) and len(rows(one)) > 30
    assert [c.label for c in one.pareto] == [c.label for c in two.pareto]
    assert calls == sorted(calls) and calls[-1] == len(two.candidates)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _as_a_terminal_starts_it() -> None:
    """In the child before exec: Ctrl-C at its default, nothing blocked, as a shell starts a
    foreground command. A process started with SIGINT ignored keeps ignoring it, as it
    should (nohup). A suite run in the background of a non-interactive shell, which
    ignores SIGINT and SIGQUIT for such commands, passed that on to the plan, which then
    ran to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _start_big_plan() -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "pipesched", *BIG_PLAN], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_a_terminal_starts_it)
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    kids = _children(proc.pid)
    assert len(kids) >= 2, "the plan did not start its workers"
    return proc, kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill"])
def test_stopping_a_plan_stops_its_workers(how):
    proc, kids = _start_big_plan()
    if how == "ctrl-c":  # the terminal's Ctrl-C reaches the whole foreground group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    expected = {"ctrl-c": 128 + signal.SIGINT, "sigterm": 128 + signal.SIGTERM, "sigkill": -signal.SIGKILL}[how]
    assert proc.returncode == expected, err
    if how != "sigkill":
        assert err.strip().splitlines()[-1].startswith("pipesched: ") and "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(k) for k in kids)
