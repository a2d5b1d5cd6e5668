"""A filesystem that fails on demand, for the resume's storage-error tests (unit tier: no Ray).

``flaky://NAME/...`` is fsspec's in-memory filesystem under another protocol, reached through
:mod:`distributed_onnx.storage` (pyarrow wraps fsspec for schemes it does not know), exactly as an object
store is. :data:`FAILURES` maps a substring of a path to how many more reads of matching paths fail with
``OSError(EIO)`` (reads: opening for reading, and file info, which the size check uses); ``-1`` fails for ever.
A key ``open:PATTERN`` or ``info:PATTERN`` fails only that operation; ``write:PATTERN`` makes a write store half
of its bytes, then fail (a connection lost during an upload). A pattern in :data:`REFUSING` makes every read of
matching paths raise ``ConnectionRefusedError``: a store that does not answer at all.
"""

from __future__ import annotations

import errno
from typing import Any

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

FAILURES: dict[str, int] = {}
#: Every read attempt that failed, in order: (operation, path).
FAILED: list[tuple[str, str]] = []
#: Substrings of paths whose every read is refused (``ConnectionRefusedError``), recorded in :data:`FAILED` too.
REFUSING: set[str] = set()


class FlakyFileSystem(MemoryFileSystem):  # type: ignore[misc]
    protocol = "flaky"
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        if text.startswith("flaky://"):
            text = text[len("flaky://") :]
        return str(super()._strip_protocol(text))

    def _maybe_fail(self, operation: str, path: str) -> None:
        if any(pattern in path for pattern in REFUSING) and operation != "write":
            FAILED.append((operation, path))
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused", path)
        for key, left in FAILURES.items():
            only, _, pattern = key.rpartition(":")
            if pattern in path and left != 0 and only in ("", operation):
                FAILURES[key] = left - 1 if left > 0 else left
                FAILED.append((operation, path))
                raise OSError(errno.EIO, f"injected I/O error ({operation})", path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self._maybe_fail("open", path)
        handle = super()._open(path, mode=mode, **kwargs)
        if "w" in mode:
            handle.write = _torn_writer(self, path, handle.write)
        return handle

    def info(self, path: str, **kwargs: Any) -> Any:
        self._maybe_fail("info", self._strip_protocol(path))
        return super().info(path, **kwargs)


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)


def _torn_writer(filesystem: FlakyFileSystem, path: str, write: Any) -> Any:
    """``write`` that, while ``write:PATTERN`` is armed, writes half of what it is given and then fails."""

    def torn_write(data: Any) -> int:
        try:
            filesystem._maybe_fail("write", path)
        except OSError:
            write(bytes(data)[: len(data) // 2])
            raise
        return int(write(data))

    return torn_write
