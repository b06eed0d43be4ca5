"""Running a `pipesched ... --json` command end to end, as the benchmarks time what users run."""
from __future__ import annotations

import json
import subprocess
import time


def run_json(cmd: list[str], label: str, env: dict | None = None) -> tuple[dict | None, float]:
    """(the command's JSON document, its wall seconds); None after printing one line
    under `label` when the command fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(f"{label}: failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None, wall
    return json.loads(done.stdout), wall
