"""A local file's sha256, computed once per version of the file on this machine.

A checkpoint's identity covers its external weights files (:mod:`.identity`); a family's weights file is hundreds
of megabytes to gigabytes, and every command that asks for an identity (a backtest's plan, each pair of a fev
benchmark, tune, export's variants) would hash it again. So a digest is kept in the package's cache folder
(:mod:`.user_cache`, ``digests/``) under the file's *version*: its resolved path, device, inode, size,
modification time and change time (nanoseconds). A write to the file changes its change time, which no call a
user makes can set back (``touch -d`` restoring the modification time sets it too), and a file replaced by
another has another inode; so a kept digest is used only for the bytes it was computed from. Two guards for what
the version cannot see:

- a file modified within :data:`RACY_S` of the hashing is not kept: on a file system with coarse timestamps a
  second write in the same tick leaves the version as it was (git keeps such "racily clean" entries apart too);
- the version is read before and after hashing, and a file that changed meanwhile is not kept.

A cache folder that cannot be written (a read-only home) only costs hashing again. Deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from pathlib import Path

from distributed_onnx import storage
from distributed_onnx.location import Location
from distributed_onnx.model.user_cache import cache_root

__all__ = ["RACY_S", "file_sha256"]

logger = logging.getLogger(__name__)

#: A file modified this recently (seconds) when it was hashed: its digest is not kept (module docstring).
RACY_S = 2.0
_DIGEST_LENGTH = 64
#: This process's digests by version, so that asking again costs one ``stat``.
_KNOWN: dict[str, str] = {}


def file_sha256(path: Path, root: Path | None = None) -> str:
    """The hex sha256 of the local file ``path``: the one kept for its version, else computed (and kept).

    ``root`` is the cache folder (default :func:`~.user_cache.cache_root`)."""
    version = _version(path)
    if version in _KNOWN:
        return _KNOWN[version]
    kept = _folder(root) / f"{hashlib.sha256(version.encode()).hexdigest()[:32]}.sha256"
    digest = _read(kept)
    if digest is None:
        digest = storage.sha256(Location(path))
        if _version(path) == version and time.time_ns() - path.stat().st_mtime_ns > RACY_S * 1e9:
            _keep(kept, digest)
        else:
            return digest  # changing, or too recent to tell the next write from this one: computed every time
    _KNOWN[version] = digest
    return digest


def _version(path: Path) -> str:
    stat = path.stat()
    fields = (path.resolve(), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return "|".join(str(field) for field in fields)


def _folder(root: Path | None) -> Path:
    return (root or cache_root()) / "digests"


def _read(kept: Path) -> str | None:
    try:
        text = kept.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    valid = len(text) == _DIGEST_LENGTH and all(char in "0123456789abcdef" for char in text)
    return text if valid else None


def _keep(kept: Path, digest: str) -> None:
    """Write ``digest`` to ``kept`` (a temporary file renamed into place: a reader sees all of it or nothing)."""
    temporary = kept.with_name(f".{kept.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(digest + "\n", encoding="ascii")
        os.replace(temporary, kept)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        logger.debug("Could not keep the digest of %s in %s: %s", kept.name, kept.parent, exc)
