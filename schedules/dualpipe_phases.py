"""The eight phases DualPipe and DualPipeV share (DeepSeek-V3 report, deepseek-ai/DualPipe).

Each rank holds two chunks, "phase 0" (the one whose forwards arrive first) and
"phase 1". With h its distance from the nearer pipeline end and n the number of
positions (p/2 for DualPipe, p for DualPipeV), a rank runs:
  1. F0 x 2(n-h-1)                     warm-up forwards
  2. (F0, F1) x (h+1)
  3. (B1, W1, F1) x (n-h-1)            zero-bubble: W right behind its B
  4. (F0&B1, F1&B0) x (k-2n+h+1)       the main overlapped pairs (k: microbatches per phase)
  5. (B1, F1&B0) x (n-h-1)
  6. (B1, B0) x (h+1)                  the second half split into B and deferred W
  7. (W, B0) x (n-h-1)
  8. the remaining Ws
"X&Y" is an overlapped pair (an F with a full backward, BW). On the rank at the turn
(h = n-1) the first step-4 pair runs unpaired, F0 then BW1, which shortens the bubble.
Ws run oldest first. With fewer than 2n microbatches per phase the phases are laid out
for 2n and the ops of the missing microbatches dropped (a pair that loses one op runs
the other alone), which keeps the order valid.
"""
from __future__ import annotations

from collections import deque

from .ir import B, BW, F, W, Overlap, ProgramItem, Task, unit_tasks


def phase_program(chunk: tuple[int, int], microbatches: tuple[list[int], list[int]],
                  n: int, h: int) -> list[ProgramItem]:
    """One rank's program. `chunk[i]` is phase i's virtual stage, `microbatches[i]` the
    microbatches it runs in order."""
    k = max(2 * n, *(len(mbs) for mbs in microbatches))
    padded = [list(mbs) + [-1] * (k - len(mbs)) for mbs in microbatches]
    next_f, next_b = [0, 0], [0, 0]
    weights: deque[Task] = deque()
    program: list[ProgramItem] = []

    def forward(ph: int) -> Task:
        task = Task(F, padded[ph][next_f[ph]], chunk[ph])
        next_f[ph] += 1
        return task

    def backward(ph: int, split: bool) -> Task:
        mb = padded[ph][next_b[ph]]
        next_b[ph] += 1
        if split:
            weights.append(Task(W, mb, chunk[ph]))
            return Task(B, mb, chunk[ph])
        return Task(BW, mb, chunk[ph])

    def weight() -> None:
        if weights:
            program.append(weights.popleft())

    for _ in range(2 * (n - h - 1)):
        program.append(forward(0))
    for _ in range(h + 1):
        program += [forward(0), forward(1)]
    for _ in range(n - h - 1):
        program.append(backward(1, split=True))
        weight()
        program.append(forward(1))
    for i in range(k - 2 * n + h + 1):
        if i == 0 and h == n - 1:
            program += [forward(0), backward(1, split=False)]
        else:
            program.append(Overlap(forward(0), backward(1, split=False)))
        program.append(Overlap(forward(1), backward(0, split=False)))
    for _ in range(n - h - 1):
        program.append(backward(1, split=False))
        program.append(Overlap(forward(1), backward(0, split=False)))
    split = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        program.append(backward(1, split))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        program.append(backward(0, split))
    for _ in range(n - h - 1):
        weight()
        program.append(backward(0, split=True))
    while weights:
        weight()
    return [_without_padding(item) for item in program if any(t.mb >= 0 for t in unit_tasks(item))]


def _without_padding(item: ProgramItem) -> ProgramItem:
    if isinstance(item, Overlap) and min(item.first.mb, item.second.mb) < 0:
        return item.first if item.first.mb >= 0 else item.second
    return item
