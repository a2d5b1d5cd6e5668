"""One backtest at a time in a run directory: a lock held for the run's whole life.

Two runs of one command on one folder would each compute every part (both see none done) and overwrite each
other's files and ``summary.json``. The second is refused at once (exit 2) naming the folder and the run that
holds it (its pid, host and start), read from the lock file.

On a local path the lock is ``DIR/run.lock`` locked with ``flock``: the kernel releases it when the process ends,
however it ends (a SIGKILLed driver's rerun resumes: ``tests/test_driver_killed.py``), so a lock file left behind
never blocks anything. An object store has no lock a process's death releases (and pyarrow offers no conditional
write), so a run on one takes none: two runs on one object-store folder remain the user's to avoid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.outputs import LOCK, check_output_folder
from distributed_onnx.location import Location

__all__ = ["run_lock"]


@contextlib.contextmanager
def run_lock(output: Location) -> Iterator[None]:
    """Hold ``output``'s lock while the block runs (a local folder, made if new); refuse if another run holds it."""
    folder = output.local_path
    if folder is None:
        yield
        return
    check_output_folder(output)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:
        raise ConfigError(f"Cannot create the run directory {output}: {exc}", key="output") from exc
    path = folder / LOCK
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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


def _holder(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
        return f"pid {record['pid']} on {record['host']}, started {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its record unreadable"
