"""One backtest at a time in a run directory: a lock held for the run's whole life.

Two runs of one command on one folder would each compute every part (both see none done) and overwrite each
other's files and ``summary.json``. The second is refused at once (exit 2) naming the folder and the run that
holds it (its pid, host and start), read from the lock file.

On a local path the lock is ``DIR/run.lock`` locked with ``flock``: the kernel releases it when the process ends,
however it ends (a SIGKILLed driver's rerun resumes: ``tests/test_driver_killed.py``), so a lock file left behind
never blocks anything. The file is opened without following a link (``O_NOFOLLOW``) and written only when it is a
regular file with one name: a symbolic or hard link planted at ``run.lock`` would otherwise have the lock's record
written over what it points to (a checkpoint, someone's notes). Such an entry is refused (exit 2) naming it, not
replaced: a lock must stay the same file for every run that opens it, and a run that swapped the entry for its own
file would lock a file the run already holding the old one never sees, and both would run.

An object store has no lock a process's death releases (and pyarrow offers no conditional
write), so a run on one takes none: two runs on one object-store folder remain the user's to avoid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.outputs import LOCK
from distributed_onnx.location import Location

__all__ = ["run_lock"]


@contextlib.contextmanager
def run_lock(output: Location) -> Iterator[None]:
    """Hold ``output``'s lock while the block runs (a local folder, made if new); refuse if another run holds it."""
    folder = output.local_path
    if folder is None:
        yield
        return
    # The folder's checks were asked up front, before Ray started, and are asked again once this lock is held, when
    # the run makes its folder (run_manifest): a folder changed since is refused there, where no other run can
    # change it again. Here only what the lock itself needs: the folder made, and run.lock a file of its own.
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:
        raise ConfigError(f"Cannot create the run directory {output}: {exc}", key="output") from exc
    path = folder / LOCK
    handle = _open_lock_file(path, output)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"--output {output} is in use by another backtest ({_holder(path)}); wait for it to end, or give "
                "another --output.",
                key="output",
            ) from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(record).encode(), 0)
        yield
    finally:
        os.close(handle)  # releases the lock


def _open_lock_file(path: Path, output: Location) -> int:
    """``path`` opened for the lock, made if new; refused (exit 2) unless a regular file with one name, so the lock's
    record is never written through a link (see the module docstring). Any other error is the storage's."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs
    try:
        handle = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENXIO):
            raise
        problem = f"a symbolic link to {os.readlink(path)}" if path.is_symlink() else exc.strerror
        raise ConfigError(f"{path}, the run's lock, cannot be written: {problem}. {_FIX}", key="output") from None
    info = os.fstat(handle)
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        return handle
    os.close(handle)
    problem = (
        "not a regular file" if not stat.S_ISREG(info.st_mode) else f"a file with {info.st_nlink} names (a hard link)"
    )
    raise ConfigError(
        f"{path}, the run's lock, is {problem}: the lock's record would be written over it. {_FIX}", key="output"
    )


_FIX = "Move that entry out of the run folder (it is not the run's) and rerun; the run makes its own."


def _holder(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
        return f"pid {record['pid']} on {record['host']}, started {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its record unreadable"
