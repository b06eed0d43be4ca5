"""Activation memory accounting on one rank.

What is counted: the bytes of every tensor storage that the runtime holds for later use,
once per storage however many holders share it:
  - tensors autograd saved for backward (saved-tensor hooks, `executor.stage`), from the
    forward that saves them until the backward that frees them (a split B frees what
    W does not need, W the rest);
  - the gradients a split B captured for its W;
  - receive buffers from posting until their op consumed them, send buffers until the
    send completed, tensors handed over locally at a V turn until taken.
Parameter storages are never counted (they are resident, not activations). Transient
temporaries inside one op are not counted either. This is the simulator's
`activation_memory` (and `weight_memory` after B) plus communication buffers.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable

from torch import Tensor


class MemoryLedger:
    """Thread-safe count of held bytes with a (time, bytes) sample at every change.

    `hold` returns a key (None for uncounted tensors) that must be `release`d exactly
    once, before the holder drops the tensor (so a storage address is never reused while
    counted)."""

    def __init__(self, clock: Callable[[], float], exclude: Iterable[Tensor] = ()):
        self._clock = clock
        self._lock = threading.Lock()
        self._refs: dict[int, list[int]] = {}  # storage address -> [holders, bytes]
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self.current = 0
        self.peak = 0
        self.times: list[float] = []
        self.levels: list[int] = []

    def hold(self, tensor: Tensor) -> int | None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._excluded or key == 0:
            return None
        with self._lock:
            entry = self._refs.get(key)
            if entry is not None:
                entry[0] += 1
                return key
            nbytes = storage.nbytes()
            self._refs[key] = [1, nbytes]
            self._change(nbytes)
        return key

    def release(self, key: int | None) -> None:
        if key is None:
            return
        with self._lock:
            entry = self._refs[key]
            entry[0] -= 1
            if entry[0] == 0:
                del self._refs[key]
                self._change(-entry[1])

    def _change(self, delta: int) -> None:
        self.current += delta
        self.peak = max(self.peak, self.current)
        self.times.append(self._clock())
        self.levels.append(self.current)

    def restart(self) -> None:
        """Start a new sampling period (a step) at the current level."""
        with self._lock:
            self.peak = self.current
            self.times = [self._clock()]
            self.levels = [self.current]
