"""The gloo transport's bookkeeping of sends, without processes: `dist.isend` replaced by
a fake whose work completes after a short wait."""
import time

import pytest

torch = pytest.importorskip("torch")

from pipesched.executor import comm  # noqa: E402
from pipesched.executor.memory import MemoryLedger  # noqa: E402
from pipesched.schedules.ir import Task  # noqa: E402


class _Work:
    def __init__(self, fail: bool):
        self.fail = fail

    def wait(self, timeout=None):
        time.sleep(0.002)
        if self.fail:
            raise RuntimeError("Connection closed by peer")


def _slow_clock():
    # a slow clock widens the window between a send completing and its bookkeeping
    time.sleep(0.005)
    return time.perf_counter()


def _transport(monkeypatch, fail=()):
    monkeypatch.setattr(comm.dist, "isend", lambda tensor, peer, tag, group=None: _Work(tag in fail))
    ledger = MemoryLedger(_slow_clock)
    return comm.GlooTransport(0, 5.0, ledger, torch.device("cpu"), transfers=4), ledger


def _sends(n):
    return [(comm.Transfer(e, 1, Task("F", e, 0), Task("F", e, 1), "activation"), torch.ones(64))
             for e in range(n)]


def test_a_drained_step_holds_no_send_buffer_and_records_every_send(monkeypatch):
    transport, ledger = _transport(monkeypatch)
    try:
        for _ in range(3):
            transport.send_all(_sends(12))
            transport.drain()
            assert ledger.current == 0 and ledger.levels[-1] == 0
        assert len(transport.done) == 36 and all(d.lane == "send" and d.end >= d.start for d in transport.done)
        assert not transport.sends
    finally:
        transport.close()


def test_a_failed_send_is_raised_by_drain_and_its_buffer_released(monkeypatch):
    transport, ledger = _transport(monkeypatch, fail={3})
    try:
        transport.send_all(_sends(6))
        with pytest.raises(comm.ExecutorError, match="could not send the activation of .* to rank 1"):
            transport.drain()
        assert ledger.current == 0 and len(transport.done) == 5
    finally:
        transport.close()
