"""How much of a makespan error is the measurement's own: the error against fewer steps.

Reads the folders `validate A,B,... --out DIR` writes (`validate_many.py --out` keeps one
per model launch) and holds each schedule's predicted makespan against the median of k of
its measured steps, for k from 2 to 40 (where the run took as many): every window of k steps in a
row, the mean |error| over the windows, then the median over runs. Grouped into the
calibration's own schedules (1F1B, ZB-H1, ZB-V: their prediction comes from another run
of the same schedule in the same launch) and the others.

Where the measured median is the only noise, the error falls as the steps grow; a fit of
error^2 = a^2 + b^2 / k over the k printed gives a, the part more measured steps would not
remove (the cost model's, and the calibration runs' own steps, which are as many as the
runs' beside them), and the error k steps would leave. With ten steps a run (validate's
default) and steps spreading 11-15 % here, a is what says whether the cost model or the
measurement sets the error.

    python benchmarks/error_vs_steps.py DIR [DIR ...]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_models import CALIBRATION_RUNS, OTHER_SPLIT_RUN  # noqa: E402

from pipesched.executor.job import representative_step  # noqa: E402
from pipesched.simulator.metrics import compute_metrics  # noqa: E402
from pipesched.simulator.trace import Trace, TraceError  # noqa: E402

CALIBRATING = set(CALIBRATION_RUNS) | {OTHER_SPLIT_RUN}
STEPS = (2, 3, 5, 7, 10, 20, 40)


def window_errors(predicted: float, steps: list[float], k: int) -> float | None:
    """Mean |predicted / median of k steps in a row - 1| over every such window; None
    where the run took fewer than k steps."""
    if len(steps) < k:
        return None
    windows = [steps[i:i + k] for i in range(len(steps) - k + 1)]
    errors = [abs(predicted / w[representative_step(w)] - 1) for w in windows]  # the step validate reports
    return sum(errors) / len(errors)


def floor_fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(a, b) of error^2 = a^2 + b^2 / k, least squares over (k, error) with a^2, b^2 >= 0."""
    if len(points) < 2:
        return None
    xs, ys = [1 / k for k, _ in points], [e * e for _, e in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else 0.0
    intercept = my - slope * mx
    if intercept < 0:  # the floor at zero: refit the slope through the origin
        intercept, slope = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return math.sqrt(intercept), math.sqrt(slope)


def read_run(folder: Path) -> tuple[str, float, list[float]]:
    """(schedule, predicted makespan in seconds, measured step makespans in order)."""
    predicted = Trace.load(folder / "predicted.json")
    steps = json.loads((folder / "measured.json").read_text())["meta"]["makespans"]
    return folder.name, compute_metrics(predicted).makespan, [float(s) for s in steps]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders written by validate --out (searched below)")
    args = ap.parse_args()
    folders = [m.parent for d in args.dirs for m in sorted(d.rglob("measured.json"))
               if (m.parent / "predicted.json").is_file()]
    if not folders:
        print("error_vs_steps: no predicted.json beside a measured.json under " + ", ".join(map(str, args.dirs)),
              file=sys.stderr)
        return 2
    groups: dict[str, dict[int, list[float]]] = {"calibration's own": {}, "others": {}}
    most = 0
    for folder in folders:
        try:
            name, predicted, steps = read_run(folder)
        except (OSError, TraceError, ValueError, KeyError) as e:
            print(f"error_vs_steps: {folder}: {e}", file=sys.stderr)
            return 2
        most = max(most, len(steps))
        group = groups["calibration's own" if name in CALIBRATING else "others"]
        for k in STEPS:
            e = window_errors(predicted, steps, k)
            if e is not None:
                group.setdefault(k, []).append(e)
    print(f"{len(folders)} runs, up to {most} measured steps each; median over runs of the mean |error| "
          f"against the median of k steps in a row (runs with at least k steps)")
    for label, by_k in groups.items():
        ks = sorted(by_k)
        cells = [f"k={k}: {100 * statistics.median(by_k[k]):.2f} % ({len(by_k[k])})" for k in ks]
        fit = floor_fit([(k, statistics.median(by_k[k])) for k in ks if len(by_k[k]) >= len(folders) // 4])
        tail = (f"; fit error^2 = a^2 + b^2/k: a {100 * fit[0]:.2f} %, b {100 * fit[1]:.1f} %, so 40 steps "
                f"would leave {100 * math.sqrt(fit[0] ** 2 + fit[1] ** 2 / 40):.2f} %") if fit else ""
        print(f"{label}: " + ", ".join(cells) + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
