"""The folder `pipesched validate` writes into (--out): checked before any work, made,
filled with the traces, costs and figure of a validation, removed when left empty."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from pipesched.schedules.outputs import check_distinct
from pipesched.simulator.cost_file import save

from ..errors import UsageError


def run_into(out: Path | None, work):
    """(`work()`, 0); on an executor error one line and (None, its exit status). `out` (if
    made yet) is removed when nothing was written into it, on any exception (which
    propagates)."""
    from pipesched.executor.comm import ExecutorError

    try:
        return work(), 0
    except ExecutorError as exc:
        print(f"pipesched: error: {exc}", file=sys.stderr)
        remove_if_empty(out)
        return None, exc.exit_status
    except BaseException:
        remove_if_empty(out)
        raise


def write_results(result, out: Path, replay: bool) -> dict:
    """Write a Validation's traces, costs and figure (and the replay with `replay`) into
    `out`; its --json document, with the files written."""
    from ..plots.compare import plot_compare

    files = list(OUT_FILES) + (["replay.json"] if replay else [])
    result.predicted.save(out / "predicted.json")
    result.measured.save(out / "measured.json")
    save(result.costs, out / "costs.json")
    if replay:
        result.replayed.save(out / "replay.json")
    plot_compare(result.predicted, result.measured, out / "validate.png")
    summary = result.summary()
    summary["files"] = [str(out / name) for name in files]
    return summary


def check_out_folder(out: str, schedule: str) -> None:
    """UsageError before any work unless --out is (or can be made) a writable folder
    whose files are not the input schedule."""
    if not out:
        raise UsageError("--out '' names no folder; leave --out out to write into a new temporary folder")
    folder = Path(out)
    existing = folder
    while not existing.exists() and existing != existing.parent:  # the folders --out would create
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {out!r} cannot be a folder: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write into --out {out!r}: permission denied in {str(existing)!r}")
    check_distinct({f"--out file {name}": str(folder / name) for name in (*OUT_FILES, "replay.json")}, {"SCHEDULE": schedule})


OUT_FILES = ("predicted.json", "measured.json", "costs.json", "validate.png")


def make_out_folder(out: str | None) -> Path:
    """The folder the results go to: --out (created if need be), else a new folder
    pipesched-validate-* in the temporary directory (never the working directory)."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="pipesched-validate-"))
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {out!r}: {exc.strerror or exc}") from None
    return Path(out)


def probe_out_folder(out: str | None) -> None:
    """UsageError unless --out can be made: the folders it needs are made and removed at
    once, so the folder itself is made only when there are results to write into it (a
    run stopped or killed on the way leaves no empty --out behind)."""
    if out is None:
        return
    missing, folder = [], Path(out)
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {out!r}: {exc.strerror or exc}") from None
    finally:
        for made in missing:  # deepest first
            remove_if_empty(made)


def remove_if_empty(folder: Path | None) -> None:
    if folder is None:
        return
    try:
        folder.rmdir()  # only succeeds when nothing was written into it
    except OSError:
        pass
