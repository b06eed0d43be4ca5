"""Ranks that share compute: several ranks on fewer CPU cores, or on one GPU.

The operating system (or the GPU's time slicing) shares the processor among whatever
is runnable: processor sharing. A computing rank asks for `compute_demand` cores (its
intra-op threads); a rank waiting for data asks for `wait_demand` cores (a
communication library that polls keeps a core busy while it waits; one that sleeps
asks for none); a finished rank asks for nothing. When the demand D exceeds the
capacity C, every computing rank runs at C / D of its dedicated speed. With
`interference` s > 0 (shared caches and memory bandwidth), compute is also
1 + s (k - 1) / (C - 1) times slower while k of the C cores are busy.

`SharedHost` is used by the DES only: the exact longest path cannot express it.
"""
from __future__ import annotations

import simpy

from .costs import HostSharing


WAITING, COMPUTING, DONE = 0, 1, 2


class SharedHost:
    """Processor sharing of one host among the ranks of a DES run."""

    def __init__(self, env: simpy.Environment, ranks: int, sharing: HostSharing):
        self.env = env
        self.sharing = sharing
        self.state = [WAITING] * ranks
        self.remaining: dict[int, float] = {}   # rank -> dedicated seconds of work left
        self.done_event: dict[int, simpy.Event] = {}
        self.rate = 1.0
        self.last = 0.0
        self.version = 0

    def _demand(self) -> float:
        s = self.sharing
        return sum(s.compute_demand if st == COMPUTING else s.wait_demand if st == WAITING else 0.0
                   for st in self.state)

    def _advance(self) -> None:
        elapsed = self.env.now - self.last
        if elapsed > 0:
            for r in self.remaining:
                self.remaining[r] -= elapsed * self.rate
        self.last = self.env.now

    def _replan(self) -> None:
        demand = self._demand()
        capacity, interference = self.sharing.capacity, self.sharing.interference
        self.rate = 1.0 if demand <= capacity else capacity / demand
        if interference and capacity > 1 and demand > 1:
            self.rate /= 1.0 + interference * (min(capacity, demand) - 1.0) / (capacity - 1.0)
        self.version += 1
        if self.remaining:
            delay = max(0.0, min(self.remaining.values()) / self.rate)
            version = self.version
            self.env.timeout(delay).callbacks.append(lambda _: self._tick(version))

    def _tick(self, version: int) -> None:
        if version != self.version:
            return  # a later change re-planned
        self._advance()
        finished = [r for r, left in self.remaining.items() if left <= 1e-12 * max(1.0, self.env.now)]
        for r in finished:
            del self.remaining[r]
            self.state[r] = WAITING
            self.done_event.pop(r).succeed()
        self._replan()

    def set_state(self, rank: int, state: int) -> None:
        if self.state[rank] != state:
            self._advance()
            self.state[rank] = state
            self._replan()

    def compute(self, rank: int, seconds: float) -> simpy.Event:
        """An event that fires when `seconds` of dedicated compute are done under sharing."""
        self._advance()
        done = self.env.event()
        if seconds <= 0:
            done.succeed()
            return done
        self.state[rank] = COMPUTING
        self.remaining[rank] = seconds
        self.done_event[rank] = done
        self._replan()
        return done
