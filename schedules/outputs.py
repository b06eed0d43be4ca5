"""Writing output files: checked before work starts, replaced atomically at the end.

Every file pipesched writes (schedule files, torch CSVs, traces, cost files, Perfetto
traces, figures) goes through `atomic_path`: the content is written to a temporary file
in the destination's folder, flushed and fsynced, then renamed over the destination
(`os.replace`, atomic on POSIX). A write that fails half way (disk full, file size
limit, a signal) leaves the previous file as it was and no temporary file behind.

Only regular files (and paths where nothing is yet) are replaced so. A character device
(/dev/null, a terminal), a FIFO, or one of the process's own open files (/dev/stdout,
/dev/stderr, /dev/fd/N, /proc/self/fd/N) is opened and written directly: renaming a file
over it would replace /dev/null for every program, or leave the reader of a FIFO with
nothing. A folder, block device or socket is refused.

This is a leaf module in the lowest layer (it imports nothing from pipesched) so that
schedules, simulator, executor and the CLI all write through it.
"""
from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

class OutputError(ValueError):
    """An output file cannot be written (or would overwrite an input); the message
    names the file and the reason. The previous file, if any, is unchanged."""


def _destination(path: str | os.PathLike) -> Path:
    """The file a write to `path` changes: a symbolic link's target, not the link."""
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


_OWN_FILES = re.compile(r"^/(?:dev/(stdout|stderr|fd/(\d+))|proc/(?:self|thread-self)/fd/(\d+))$")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def own_fd(path: str | os.PathLike) -> int | None:
    """The file descriptor `path` names when it is one of this process's own open files
    (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N), else None."""
    match = _OWN_FILES.match(os.fspath(path))
    if not match:
        return None
    name, fd, proc_fd = match.groups()
    return {"stdout": 1, "stderr": 2}[name] if name else int(fd or proc_fd)


def is_stream(path: str | os.PathLike) -> bool:
    """Whether a write to `path` goes straight to it rather than through a temporary file
    renamed over it: a character device, a FIFO, or the process's own open file
    (/dev/stdout, /dev/fd/N, ...), whatever that is."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or (own_fd(path) is not None and stat.S_ISREG(mode))


def _not_a_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a stream."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_writable(path: str | os.PathLike) -> None:
    """OutputError unless a file can be written at `path`: its folder exists and is
    writable, and it is not a folder (or block device, socket) itself; a character
    device or FIFO must be writable. Called before any long work, so a run does not fail
    at its end."""
    if not os.fspath(path):
        raise OutputError("cannot write '': the output name is empty")
    kind = _not_a_file(path)
    if kind is not None:
        raise OutputError(f"cannot write {str(path)!r}: it is {kind}")
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {str(path)!r}: permission denied")
        return
    p = _destination(path)
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"cannot write {str(path)!r}: there is no folder {str(folder)!r}")
    # the new file is created beside the old one and renamed, so the folder must be writable
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {str(path)!r}: permission denied in folder {str(folder)!r}")


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def check_distinct(outputs: Mapping[str, str | os.PathLike | None],
                   inputs: Mapping[str, str | os.PathLike | None] = {}) -> None:
    """OutputError when an output file is also an input file, or two outputs are the
    same file. Keys are the option names the message quotes (e.g. "--trace")."""
    outs = [(k, v) for k, v in outputs.items() if v]
    ins = [(k, v) for k, v in inputs.items() if v]
    for i, (name, out) in enumerate(outs):
        for in_name, src in ins:
            if _same_file(out, src) and not _is_device(out):
                raise OutputError(f"{name} {str(out)!r} is also the input {in_name}; "
                                  "writing it would destroy the input, choose another name")
        for other_name, other in outs[i + 1:]:
            if _same_file(out, other) and not _is_device(out):  # -o /dev/null --plot /dev/null is fine
                raise OutputError(f"{name} and {other_name} name the same file {str(out)!r}")


def _is_device(path: str | os.PathLike) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _new_file_mode(existing: Path) -> int:
    """The permission bits the written file gets: the replaced file's, or what a plain
    open() would give a new file (0666 less the umask)."""
    try:
        return existing.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in `path`'s folder (same suffix, so writers that choose a
    format by extension still do); when the block ends without an exception, fsync it
    and rename it over `path`. On any failure the temporary file is removed and `path`
    is unchanged; OSError becomes OutputError. A character device, FIFO or the
    process's own open file (`is_stream`) is yielded itself, to be written directly; a
    folder or other file that is not regular is an OutputError."""
    kind = _not_a_file(path)
    if kind is not None:
        raise OutputError(f"cannot write {str(path)!r}: it is {kind}")
    if is_stream(path):
        try:
            if own_fd(path) is not None and stat.S_ISREG(os.stat(path).st_mode):
                with _through_fd(own_fd(path), Path(path).suffix) as tmp:  # type: ignore[arg-type]
                    yield tmp
            else:
                yield Path(path)
        except OSError as exc:  # e.g. ENOSPC from /dev/full, EPIPE from a FIFO whose reader left
            raise OutputError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
        return
    dest = _destination(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=f".tmp{dest.suffix}", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _new_file_mode(dest))
        os.replace(tmp, dest)
    except BaseException as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {str(path)!r}: {exc.strerror or exc}; "
                              "the previous file (if any) is unchanged") from None
        raise
    _sync_folder(folder)


@contextmanager
def _through_fd(fd: int, suffix: str) -> Iterator[Path]:
    """A temporary file whose content, when the block ends without an exception, is
    written to the open file `fd` at its own offset (opening /dev/stdout again would
    truncate a redirected stdout and write over what the command prints)."""
    handle, name = tempfile.mkstemp(prefix=".pipesched-out.", suffix=suffix)
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        with open(tmp, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every system can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str, newline: str | None = None) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline=newline) as fh:
            fh.write(text)
            fh.flush()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
