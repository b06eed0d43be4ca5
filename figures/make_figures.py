"""Regenerate the README's figures: `python figures/make_figures.py` (from anywhere).

Uses only pipesched's public API and command line. Writes into this folder:
  schedules.png  every built-in schedule at p=4, m=8, on one time axis;
  dualpipe.png   DualPipe at p=4, m=8 in full: transfers and memory per rank;
  recompute.png  1F1B, ZB-H2 and ZB-H2 with activation recomputation (R ops, purple) at
                 p=4, m=8 on one time axis, each headed by its peak memory;
  sweep.png      bubble and peak memory against m for every schedule at p=4, and
                 makespan against peak memory at m=32 (the Pareto front);
  vs_torch.png   our schedules against torch.distributed.pipelining's of the same name,
                 both in our simulator, at p=4, m=16 under F,B,W = 1,1,1 / 1,2,1 / 2,3,1
                 (only where torch is installed);
  measured.png   predicted vs measured (`pipesched validate`): ZB-H1 on this machine (CPU,
                 gloo, one core per rank, so p=2 on two cores, an MLP of hidden size 512),
                 the simulation under costs calibrated on this machine beforehand against
                 the executor's measured step of median makespan (of 9); only with
                 --measured and where torch is installed, otherwise a note says why not.
All figures share one cost model (COSTS below), typical of a transformer stage.

Every figure but measured.png is computed, not measured, and saved without dates or
versions in the file (pipesched.plots.style.save), so a rerun on one machine writes the
same bytes and `git status` shows only figures whose picture changed. measured.png is a
real run: its timings, and so its bytes, differ on every run; it is left as it is unless
--measured asks for a new run.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipesched.plots.compare import plot_compare
from pipesched.plots.gallery import plot_gallery
import pipesched as ps
from pipesched.schedules.registry import BUILDERS
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import Link, Network, uniform
from pipesched.simulator.trace import Trace

HERE = Path(__file__).resolve().parent
P, M = 4, 8
# per pipeline stage: F 10 ms, B 10 ms, W 8 ms; 64 MiB activations over 25 GB/s + 20 us
# (2.7 ms a transfer); 2 GiB of parameters and optimizer state; 1 GiB of activations per
# microbatch, 40 % of which W still needs after B
COST_FLAGS = ["--f", "0.010", "--b", "0.010", "--w", "0.008", "--latency", "20e-6", "--bandwidth", "25e9",
              "--activation-bytes", str(64 * 2**20), "--activation-memory", str(2**30),
              "--weight-memory", str(0.4 * 2**30), "--param-bytes", str(2 * 2**30)]
COSTS = uniform(0.010, 0.010, 0.008, activation_bytes=64 * 2**20, activation_memory=2**30,
                weight_memory=0.4 * 2**30, param_bytes=2 * 2**30, network=Network(Link(20e-6, 25e9)))
MEASURED_SCHEDULE = "zb-h1"
# one core per rank, so that the prediction (which assumes dedicated ranks) is a fair one
MEASURED_P = max(2, min(P, os.cpu_count() or 1))


def cli(*args: str) -> None:
    """Run `pipesched ARGS` (the installed command line, as a user would)."""
    subprocess.run([sys.executable, "-m", "pipesched", *args], check=True, stdout=subprocess.DEVNULL)


def schedules() -> Path:
    traces = [simulate(ps.build(name, P, M, costs=COSTS), COSTS) for name in BUILDERS]
    out = HERE / "schedules.png"
    plot_gallery(traces, out, title=f"every built-in schedule at p={P}, m={M} on one time axis "
                                    "(F 10 ms, B 10 ms, W 8 ms per stage; transfers 2.7 ms)")
    return out


def dualpipe() -> Path:
    out = HERE / "dualpipe.png"
    cli("simulate", "dualpipe", "-p", str(P), "-m", str(M), *COST_FLAGS, "--plot", str(out))
    return out


def recompute() -> Path:
    """Does ZB-H2 with recomputation fit where 1F1B does, and is it still faster?"""
    traces = [simulate(ps.build(name, P, M, costs=COSTS, recompute=rc), COSTS)
              for name, rc in (("1f1b", False), ("zb-h2", False), ("zb-h2", True))]
    out = HERE / "recompute.png"
    plot_gallery(traces, out, title=f"activation recomputation at p={P}, m={M}: R (purple) re-runs F before "
                                    "each backward; F keeps only its input")
    return out


def sweep() -> Path:
    out = HERE / "sweep.png"
    cli("sweep", "-p", str(P), "--microbatches", "4,8,16,32,64", *COST_FLAGS, "--pareto-m", "32", "--plot", str(out))
    return out


def vs_torch() -> Path | None:
    if importlib.util.find_spec("torch") is None:
        print("skipped vs_torch.png: torch is not installed")
        return None
    from pipesched.executor.torch_schedules import compare_with_torch
    from pipesched.plots.vs_torch import plot_vs_torch

    rows = [{**row, "costs": list(fbw)} for fbw in ((1, 1, 1), (1, 2, 1), (2, 3, 1))
            for row in compare_with_torch(4, 16, uniform(*fbw, activation_memory=1.0))]
    return plot_vs_torch(rows, HERE / "vs_torch.png", "pipesched vs torch.distributed.pipelining 2.13 "
                         "(p=4, m=16; both orders in pipesched's simulator)")


def executor_missing() -> str | None:
    """Why the executor cannot produce a measured trace here, or None if it can."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install 'pipesched[torch]')"
    return None


def measured() -> Path | None:
    """`pipesched validate`: calibrate on this machine, predict, run, compare."""
    reason = executor_missing()
    if reason:
        print(f"skipped measured.png: {reason}; rerun this script once the executor runs here")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run([sys.executable, "-m", "pipesched", "validate", MEASURED_SCHEDULE, "-p", str(MEASURED_P),
                              "-m", str(M), "--hidden", "512", "--microbatch-size", "32", "--steps", "9",
                              "--warmup", "2", "--out", tmp], capture_output=True, text=True)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["no message"])[-1]
            print(f"skipped measured.png: `pipesched validate` failed: {last}")
            return None
        predicted, real = Trace.load(Path(tmp) / "predicted.json"), Trace.load(Path(tmp) / "measured.json")
    out = HERE / "measured.png"
    plot_compare(predicted, real, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", action="store_true",
                    help="also rerun `pipesched validate` for measured.png (a real run: new timings, new bytes)")
    args = ap.parse_args(argv)
    makers = [schedules, dualpipe, recompute, sweep, vs_torch]
    if args.measured:
        makers.append(measured)
    else:
        print("kept figures/measured.png: it is a real run whose timings differ every time; "
              "--measured runs it again")
    for make in makers:
        out = make()
        if out is not None:
            print(f"wrote {out.relative_to(HERE.parent)} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
