"""The zero-bubble paper's Table 5 from its own profiled costs: our bubble rates beside theirs.

Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241v1),
Section 5.3, Table 5: bubble rates of 1F1B, ZB-H1, ZB-H2, ZB-1p and ZB-2p, "based on
theoretical calculations", for their 1.5B, 6.2B, 14.6B and 28.3B GPT-like models at their
p and m. The inputs are theirs, held out (nothing here is fitted to Table 5):
  - Table 9 (Appendix D): T_F, T_B, T_W and T_comm per model, p and m, milliseconds, as
    profiled in ZB-2p runs;
  - Table 3: hidden size h, attention heads a, sequence length s = 1024;
  - Table 1 and Section 5.1: per layer and token, an F stores M_B = 34h + 5as until its B,
    which frees all but M_W = 32h until its W; ZB-1p may hold p M_B, ZB-2p 2p M_B.
The numbers were read from a markdown transcription of the v1 PDF (tables 1-12 kept as
tables) in the public code index, since the PDF itself is not stored here; the rows
below are typed from it.

Our side, per row: every pipeline stage takes T_F, T_B, T_W; a transfer between stages
takes T_comm (latency only, links without contention: the paper adds T_comm to each
F->F and B->B dependency, its ILP's constraints 4 and 5); memory is activation_memory
M_B and weight_memory M_W per stage (the simulator's model of exactly this), no
parameters or buffers counted. ZB-1p and ZB-2p are `zb-auto` with one chunk per rank
(the paper's placement) under memory limits p M_B and 2p M_B, searched without a step
barrier (the paper's optimizer post-validation: each rank starts its next step once its
own ops are done), so they minimize the steady-state period. 1F1B, ZB-H1 and ZB-H2 are
our built-ins.

Bubble rate, the paper's: per rank, from its first F to its last op, (span - m(T_F + T_B +
T_W)) / span, the longest rank counted, on one simulated step. Beside it, the
steady-state rate without a barrier, 1 - m(T_F + T_B + T_W) / period.

Usage: python benchmarks/zb_paper.py [--rows 1.5B,6.2B]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipesched.schedules.registry import build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402
from pipesched.simulator.api import simulate  # noqa: E402
from pipesched.simulator.budget import Budget, build_within  # noqa: E402
from pipesched.simulator.costs import CostModel, uniform  # noqa: E402
from step_barrier import zb_bubble  # noqa: E402

SEQUENCE = 1024  # Table 3: every model's sequence length
MODELS = {"1.5B": (2304, 24), "6.2B": (4096, 32), "14.6B": (5120, 40), "28.3B": (6144, 48)}  # Table 3: h, a
COLUMNS = ("1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p")
CHECKED = ("1f1b", "zb-1p", "zb-2p")  # the columns the headline counts
WITHIN = 0.002  # 0.2 points of bubble rate


class Row(NamedTuple):
    """One row of Tables 9 and 5: times in milliseconds, published bubble rates by column."""

    model: str
    p: int
    m: int
    f: float
    b: float
    w: float
    comm: float
    published: dict


def _row(model: str, p: int, m: int, f: float, b: float, w: float, comm: float, *rates: float) -> Row:
    # Table 5's columns in its order: 1F1B, 1F1B-I (not ours to build), ZB-H1, ZB-H2, ZB-1p, ZB-2p
    one_f1b, _, h1, h2, zb1, zb2 = rates
    return Row(model, p, m, f, b, w, comm, {"1f1b": one_f1b, "zb-h1": h1, "zb-h2": h2, "zb-1p": zb1, "zb-2p": zb2})


ROWS = [  # Table 9 (T_F, T_B, T_W, T_comm in ms), then Table 5 (bubble rates)
    _row("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 0.2431, 0.1055, 0.1585, 0.1083, 0.1585, 0.0433),
    _row("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 0.1985, 0.0818, 0.1242, 0.0837, 0.1242, 0.0039),
    _row("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 0.1240, 0.0443, 0.0674, 0.0444, 0.0674, 0.0026),
    _row("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 0.2347, 0.0808, 0.1323, 0.0698, 0.1323, 0.0029),
    _row("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 0.1898, 0.0628, 0.1045, 0.0559, 0.1045, 0.0022),
    _row("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 0.1091, 0.0320, 0.0554, 0.0294, 0.0554, 0.0010),
    _row("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 0.2552, 0.1104, 0.1397, 0.0672, 0.1397, 0.0066),
    _row("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 0.2082, 0.0852, 0.1088, 0.0516, 0.1088, 0.0054),
    _row("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 0.1251, 0.0445, 0.0576, 0.0266, 0.0576, 0.0028),
    _row("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 0.2646, 0.1493, 0.1421, 0.0641, 0.1421, 0.0038),
    _row("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 0.2168, 0.1164, 0.1106, 0.0490, 0.1106, 0.0029),
    _row("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 0.1352, 0.0624, 0.0594, 0.0257, 0.0594, 0.0018),
]


def memory_per_stage(model: str) -> tuple[float, float]:
    """(M_B, M_W) per layer and token (Table 1 over s b): 34h + 5as and 32h. Only their
    ratio and the limits' multiples of M_B matter, so layers and tokens are left out."""
    h, a = MODELS[model]
    return 34.0 * h + 5.0 * a * SEQUENCE, 32.0 * h


def costs_for(row: Row) -> CostModel:
    """The row's costs: seconds per op, T_comm per transfer, the paper's memory model."""
    act, kept = memory_per_stage(row.model)
    return uniform(row.f * 1e-3, row.b * 1e-3, row.w * 1e-3, latency=row.comm * 1e-3, contention=False,
                   comm_buffers=False, activation_memory=act, weight_memory=kept)


def bubbles(row: Row, columns: tuple[str, ...] = COLUMNS) -> dict[str, tuple[float, float, float]]:
    """Per column: (our bubble rate as the paper counts it, our steady-state bubble rate
    without a barrier, seconds the build took)."""
    costs = costs_for(row)
    ideal = row.m * (row.f + row.b + row.w) * 1e-3
    act, _ = memory_per_stage(row.model)
    out = {}
    for column in columns:
        t = time.perf_counter()
        if column in ("zb-1p", "zb-2p"):
            limit = (1 if column == "zb-1p" else 2) * row.p * act
            schedule = build_within("zb-auto", row.p, row.m, 1, costs, Budget(memory_limit=limit),
                                    step_barrier="none")
        else:
            schedule = build(column, row.p, row.m, None, costs.op_time_for(row.p))
        built = time.perf_counter() - t
        graph = validate(schedule)
        one = simulate(graph, costs, engine="exact")
        steps = simulate(graph, costs, engine="exact", step_barrier="none")
        out[column] = (zb_bubble(one), 1 - ideal / steps.meta["steps"]["period"], built)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="models to run, comma-separated (default: all four)")
    args = parser.parse_args()
    models = args.rows.split(",") if args.rows else list(MODELS)
    unknown = [x for x in models if x not in MODELS]
    if unknown:
        parser.exit(2, f"zb_paper.py: error: unknown model {unknown[0]!r}; the paper's are {', '.join(MODELS)}\n")
    print("bubble rate (%): ours (the paper's per-rank count, one step) / published / ours - published; "
          "steady = ours without a barrier, 1 - m(F+B+W)/period")
    print(f"{'model':<6}{'p':>3}{'m':>5} | " + " | ".join(f"{c:^27}" for c in COLUMNS))
    diffs: list[tuple[float, str]] = []
    total = time.perf_counter()
    for row in (r for r in ROWS if r.model in models):
        ours = bubbles(row)
        cells = []
        for c in COLUMNS:
            mine, steady, _ = ours[c]
            d = mine - row.published[c]
            cells.append(f"{100 * mine:6.2f} {100 * row.published[c]:6.2f} {100 * d:+6.2f} s{100 * steady:5.2f}")
            if c in CHECKED:
                diffs.append((abs(d), f"{c} {row.model} m={row.m}"))
        build_s = ours["zb-1p"][2] + ours["zb-2p"][2]
        print(f"{row.model:<6}{row.p:>3}{row.m:>5} | " + " | ".join(cells) + f"  (zb-auto {build_s:.1f} s)",
              flush=True)
    within = sum(d <= WITHIN + 1e-12 for d, _ in diffs)
    worst = max(diffs)
    print(f"{within} of {len(diffs)} checked cells ({', '.join(CHECKED)}) within {100 * WITHIN:.1f} points; "
          f"worst {100 * worst[0]:.2f} points ({worst[1]}); {time.perf_counter() - total:.0f} s")


if __name__ == "__main__":
    main()
