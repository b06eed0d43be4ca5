"""Our schedules against torch.distributed.pipelining's of the same name (the chart of `benchmarks/vs_torch_report.py`)."""
from __future__ import annotations

from pathlib import Path

from .style import save  # sets the Agg backend before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402,I001

COST_COLORS = ("#3b75af", "#ef8636", "#519e3e")


def plot_vs_torch(rows: list[dict], path: str | Path, title: str) -> Path:
    """Grouped bars per schedule: makespan over the ideal m(F+B+W) for each cost model,
    ours solid, torch's outlined beside it; and the fullest rank's peak activations.
    `rows`: dicts with schedule, costs [f, b, w], m, makespan, torch_makespan,
    peak_memory, torch_peak_memory (see executor.torch_schedules.compare_with_torch)."""
    rows = [r for r in rows if "refused" not in r]
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    costs = list(dict.fromkeys(tuple(r["costs"]) for r in rows))
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1.2]})
    width = 0.8 / (2 * len(costs))
    for c, cost in enumerate(costs):
        for n, name in enumerate(names):
            r = next(x for x in rows if x["schedule"] == name and tuple(x["costs"]) == cost)
            ideal = r["m"] * sum(cost)
            x = n - 0.4 + (2 * c + 0.5) * width
            ax.bar(x, r["makespan"] / ideal, width, color=COST_COLORS[c % 3],
                   label=f"F,B,W = {','.join(f'{v:g}' for v in cost)}: pipesched" if n == 0 else None)
            ax.bar(x + width, r["torch_makespan"] / ideal, width, facecolor="white", edgecolor=COST_COLORS[c % 3],
                   hatch="///", label="torch" if n == 0 and c == len(costs) - 1 else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("makespan / ideal m(F+B+W)")
    ax.set_ylim(1.0, max(max(r["makespan"], r["torch_makespan"]) / (r["m"] * sum(r["costs"])) for r in rows) * 1.05)
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    first = [next(x for x in rows if x["schedule"] == name) for name in names]
    mem.barh(range(len(names)), [r["peak_memory"] for r in first], 0.4, color="#7f7f7f", label="pipesched")
    mem.barh([i + 0.4 for i in range(len(names))], [r["torch_peak_memory"] for r in first], 0.4,
             facecolor="white", edgecolor="#7f7f7f", hatch="///", label="torch")
    mem.set_yticks([i + 0.2 for i in range(len(names))], names)
    mem.invert_yaxis()
    mem.set_xlabel("peak activations, fullest rank (microbatches)")
    mem.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out = save(fig, path)
    plt.close(fig)
    return out
