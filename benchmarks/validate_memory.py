"""Host memory of `pipesched validate A,B,...` as the schedules compared grow in number.

One calibration predicts every schedule and their runs take steps in turn, so every
schedule is open at once; each example model is built once per split and shared by the
runs of that split (`executor.job.share_built_models`). This runs the command end to end
for two schedules, then for eight (both splits: v = 1 and v = 2), sampling the summed
resident memory of the launcher and its ranks every 50 ms, and prints the peaks and
their ratio (measured in the same run).

    python benchmarks/validate_memory.py [--hidden 1024] [--microbatch-size 64] [-m 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TWO = "1f1b,zb-h1"
EIGHT = "gpipe,1f1b,zb-h1,zb-h2,interleaved-1f1b,zb-v,dualpipev,v-half"


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[int(entry)] = int(line.split()[1]) * 1024
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def peak_of(cmd: list[str]) -> tuple[int, float]:
    """(peak summed RSS in bytes, wall seconds) of `cmd`, which must succeed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.read().strip()}")
    return peak, time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--microbatch-size", type=int, default=64)
    ap.add_argument("-m", "--microbatches", type=int, default=8)
    args = ap.parse_args()
    peaks = {}
    with tempfile.TemporaryDirectory() as out:
        for label, schedules in (("two", TWO), ("eight", EIGHT)):
            cmd = ["pipesched", "validate", schedules, "-p", "2", "-m", str(args.microbatches),
                   "--model", "mlp", "--hidden", str(args.hidden), "--microbatch-size", str(args.microbatch_size),
                   "--layers-per-stage", "2", "--steps", "2", "--warmup", "1", "--out", f"{out}/{label}"]
            peaks[label], wall = peak_of(cmd)
            print(f"validate {schedules}: peak {peaks[label] / 2**30:.2f} GiB (launcher and ranks), {wall:.0f} s",
                  flush=True)
    print(f"eight schedules / two: {peaks['eight'] / peaks['two']:.2f}x the memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
