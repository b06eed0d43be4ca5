"""Models drawn from a seeded generator, for the accuracy benchmarks.

A fresh seed is a fresh set of models nobody tuned the predictor for: the example MLP or
transformer with a hidden size of 96-1536, a depth, a microbatch size and (transformer) a
sequence length, and a microbatch count m per p, kept when one rank's forward is 0.3-10 ms
by a rough estimate. `accuracy_random.py` runs them in one launch per model and
`validate_many.py` through the `pipesched validate` command.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev")
CALIBRATION_RUNS = ("1f1b", "zb-h1")  # the runs `validate` reads its costs from
OTHER_SPLIT_RUN = "zb-v"  # ... and the run at v = 2 that gives the ops' fixed cost
RANKING_TOLERANCE = 0.02  # a pick within 2 % of the measured fastest counts as right


@dataclass(frozen=True)
class Draw:
    """One drawn model: `depth` blocks per rank (v = 1: one model stage of `depth`
    blocks; v = 2: two of depth / 2), and the microbatches m per p."""

    kind: str
    hidden: int
    depth: int
    microbatch_size: int
    seq: int
    m_per_p: dict

    def model(self, v: int):
        """The example model split for `v` model stages per rank (needs torch)."""
        from pipesched.executor.models import ExampleModel
        return ExampleModel(self.kind, hidden=self.hidden, layers_per_stage=self.depth // v,
                            microbatch_size=self.microbatch_size, seq=self.seq)

    def forward_flops(self) -> float:
        """Floating-point operations of one forward of one rank's share (v = 1)."""
        h = self.hidden
        if self.kind == "mlp":
            return 16.0 * self.microbatch_size * h * h * self.depth
        return self.microbatch_size * self.seq * (24.0 * h * h + 4.0 * self.seq * h) * self.depth

    def describe(self) -> str:
        """One line: kind, hidden, depth, microbatch size, sequence and m per p."""
        seq = f", seq {self.seq}" if self.kind == "transformer" else ""
        return (f"{self.kind} hidden {self.hidden}, {self.depth} blocks per rank, "
                f"microbatch {self.microbatch_size}{seq}, m {self.m_per_p}")


def estimated_forward(draw: Draw) -> float:
    """Seconds, roughly, on one core of a 2-core VM (a fixed cost plus 30 GFLOP/s)."""
    return 2.5e-4 + draw.forward_flops() / 30e9


def draw_models(seed: int, count: int, ranks: list[int]) -> list[Draw]:
    """`count` models from `seed` whose forward per rank is 0.3-10 ms by `estimated_forward`
    (measured 0.7-21 ms on the 2-core VM). The same seed and `ranks` give the same models."""
    rng = np.random.default_rng(seed)
    models: list[Draw] = []
    while len(models) < count:
        kind = str(rng.choice(["mlp", "transformer"]))
        hidden = int(round(np.exp(rng.uniform(np.log(96), np.log(1536))) / 32) * 32)
        depth = int(rng.choice([2, 4, 6]))
        mbs = int(rng.choice([4, 8, 16, 32, 64] if kind == "mlp" else [1, 2, 4, 8]))
        seq = int(rng.choice([32, 64, 128])) if kind == "transformer" else 32
        m_per_p = {p: int(p * rng.choice([1, 2, 3, 4, 6, 8])) for p in ranks}
        draw = Draw(kind, hidden, depth, mbs, seq, m_per_p)
        if 3e-4 <= estimated_forward(draw) <= 1e-2:
            models.append(draw)
    return models
