import os
import tempfile
from pathlib import Path

import pytest

# keep the tests on one thread per process: the machine has 2 cores and several ranks
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

LEFT_BEHIND = "pipesched-*"
"""What pipesched names its temporary files and folders (e.g. validate's default --out,
pipesched-validate-*): none may outlive the test that made it."""


@pytest.fixture(scope="session", autouse=True)
def suite_temporary_directory(tmp_path_factory) -> Path:
    """The suite's temporary directory: one folder of its own, for this process
    (tempfile) and for every command a test starts (TMPDIR), so that what a test leaves
    there is seen (and never mixed up with other programs' files in the system's)."""
    folder = tmp_path_factory.mktemp("tempdir")
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    yield folder
    tempfile.tempdir = saved_tempdir
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(autouse=True)
def nothing_left_in_the_temporary_directory(suite_temporary_directory: Path):
    """Fails the test after which a pipesched-* file or folder is left in the temporary
    directory (a command that does not clean up, or a test that should pass --out
    tmp_path), and removes it so that the next test starts clean."""
    before = set(suite_temporary_directory.glob(LEFT_BEHIND))
    yield
    left = sorted(set(suite_temporary_directory.glob(LEFT_BEHIND)) - before)
    for path in left:
        _remove(path)
    if left:
        pytest.fail(f"left in the temporary directory: {', '.join(p.name for p in left)}", pytrace=False)


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
