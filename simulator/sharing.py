"""Ranks that share compute: several ranks on fewer CPU cores, or on one GPU.

The operating system (or the GPU's time slicing) shares the processor among whatever
is runnable: processor sharing. A computing rank asks for `compute_demand` cores (its
intra-op threads); a rank waiting for data asks for `wait_demand` cores (a
communication library that polls keeps a core busy while it waits; one that sleeps
asks for none); a finished rank asks for nothing. When the demand D exceeds the
capacity C, every computing rank runs at C / D of its dedicated speed. With
`interference` s > 0 (shared caches and memory bandwidth), compute is also
1 + s (k - 1) / (C - 1) times slower while k of the C cores are busy. With `pinned`,
rank r runs on core r mod C only (as the executor pins ranks when they outnumber the
cores) and the ranks of one core share that core alone, each `switching` slower than
its fair share (every switch evicts the other's data from the core's caches).

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
        self.rate: dict[int, float] = {}        # rank -> speed as a fraction of dedicated
        self.last = 0.0
        self.version = 0
        self.cores = max(1, int(sharing.capacity))

    def _demand(self, rank: int) -> float:
        st, s = self.state[rank], self.sharing
        return s.compute_demand if st == COMPUTING else s.wait_demand if st == WAITING else 0.0

    def _rates(self) -> tuple[dict[int, float], float]:
        """(speed of every computing rank, busy cores)."""
        s = self.sharing
        if s.pinned:  # rank r on core r mod cores; the ranks of one core share it
            per_core = [0.0] * self.cores
            for r in range(len(self.state)):
                per_core[r % self.cores] += self._demand(r)
            busy = float(sum(d > 0 for d in per_core))
            rates = {}
            for r in self.remaining:
                sharing = per_core[r % self.cores]
                rates[r] = 1.0 if sharing <= 1 else 1.0 / (sharing * (1.0 + s.switching))
        else:
            demand = sum(self._demand(r) for r in range(len(self.state)))
            busy = min(s.capacity, demand)
            share = 1.0 if demand <= s.capacity else s.capacity / demand
            rates = {r: share for r in self.remaining}
        if s.interference and s.capacity > 1 and busy > 1:
            slower = 1.0 + s.interference * (busy - 1.0) / (s.capacity - 1.0)
            rates = {r: x / slower for r, x in rates.items()}
        return rates, busy

    def _advance(self) -> None:
        elapsed = self.env.now - self.last
        if elapsed > 0:
            for r in self.remaining:
                self.remaining[r] -= elapsed * self.rate.get(r, 1.0)
        self.last = self.env.now

    def _replan(self) -> None:
        self.rate, _ = self._rates()
        self.version += 1
        if self.remaining:
            delay = max(0.0, min(left / self.rate[r] for r, left in self.remaining.items()))
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
