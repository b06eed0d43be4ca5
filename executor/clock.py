"""One clock for all ranks, and op timers.

Ranks on one host share `time.perf_counter` (CLOCK_MONOTONIC on Linux), so their offset
is 0. Across hosts each rank estimates its offset to rank 0 by ping-pong at start-up
(the round trip with the smallest delay wins, NTP-style) and subtracts it.

Op timers: on CPU an op's start and end are `perf_counter` readings; on a GPU they are
CUDA events, turned into host seconds after the step against an anchor event recorded
when the host and the device were in sync.
"""
from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

PING_ROUNDS = 16


def now() -> float:
    """Seconds on this host's monotonic clock."""
    return time.perf_counter()


def clock_offset(rank: int, world: int, force: bool = False, device: torch.device | None = None) -> float:
    """Seconds to subtract from this rank's `now()` to get rank 0's clock. Collective:
    every rank calls it. 0 where all ranks share a host (unless `force`). `device`: where
    the process group's tensors live (a CUDA device under NCCL)."""
    hosts: list = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if not force and len(set(hosts)) == 1:
        return 0.0
    stamp = torch.zeros(1, dtype=torch.float64, device=device)
    offset, best = 0.0, float("inf")
    for peer in range(1, world):
        for _ in range(PING_ROUNDS):
            if rank == 0:
                dist.recv(stamp, peer)
                stamp[0] = now()
                dist.send(stamp, peer)
            elif rank == peer:
                sent = now()
                dist.send(stamp, 0)
                dist.recv(stamp, 0)
                back = now()
                if back - sent < best:  # rank 0 read its clock about halfway
                    best, offset = back - sent, (sent + back) / 2 - stamp.item()
    dist.barrier()
    return offset


class CpuTimer:
    """Op times from the host clock."""

    def mark(self) -> float:
        return now()

    def seconds(self, mark: float) -> float:
        return mark

    def sync(self) -> None:
        pass


class CudaTimer:
    """Op times from CUDA events on the current stream, in host seconds."""

    def __init__(self, device: torch.device):
        self.device = device
        self.anchor_host = 0.0
        self.anchor: torch.cuda.Event | None = None

    def start_step(self) -> None:
        torch.cuda.synchronize(self.device)
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        torch.cuda.synchronize(self.device)
        self.anchor_host = now()

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, mark: torch.cuda.Event) -> float:
        return self.anchor_host + self.anchor.elapsed_time(mark) / 1e3

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)
