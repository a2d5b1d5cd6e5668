"""What a local path a command reads is, in words, when it is not the file the command wants: a name longer than
its file system takes, a folder, a symbolic link in a loop or to nothing.

A name over the file system's limit (NAME_MAX: 255 bytes on Linux's) is not a file that is missing or unreadable:
the system refuses the path itself (``ENAMETOOLONG``, ``File name too long``). Given as any command's input
(``--checkpoint``, ``--config``, ``inspect``'s checkpoint), it surfaced as an ``I/O error`` (exit 3) advising a
rerun that resumes, which no rerun could get past; ``--tuned`` said the file "is not JSON". It is bad input (exit 2):
the output checks refuse it before a run (:mod:`~distributed_onnx.evaluation.output_checks`), and every read or
write the system refused for it becomes :func:`name_too_long_error`'s one line, wherever it was asked
(:mod:`~distributed_onnx.cli_errors` for every command; the readers that wrap their ``OSError`` ask it first).

A folder or a link in a loop given where a file is read was "not found" (``--data``, ``--checkpoint``,
``--config``), which sent the user looking for a file that is there: :func:`not_a_file` says what is there.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.redact import shortened

__all__ = [
    "DEFAULT_NAME_MAX",
    "NameTooLongError",
    "longest_name",
    "name_too_long",
    "name_too_long_error",
    "not_a_file",
]

#: NAME_MAX where the file system does not say (Linux's file systems and most others).
DEFAULT_NAME_MAX = 255
#: The characters of a too-long name a message shows: its start and end (:func:`~distributed_onnx.redact.shortened`).
SHOWN_NAME = 60


class NameTooLongError(ConfigError):
    """A path holding a name longer than its file system takes (bad input, exit 2: rename it or give another)."""


def longest_name(path: Path) -> int:
    """The most bytes a name may have in ``path``'s file system (NAME_MAX), asked of the deepest folder of it that
    exists (the name itself may be the one too long); :data:`DEFAULT_NAME_MAX` where the system does not say."""
    try:
        existing = next((each for each in path.absolute().parents if each.is_dir()), None)
        return os.pathconf(existing, "PC_NAME_MAX") if existing is not None else DEFAULT_NAME_MAX
    except (OSError, ValueError):
        return DEFAULT_NAME_MAX


def name_too_long(path: Path) -> str | None:
    """What is too long in ``path``, in words (``its name aaa...aaa.onnx is 304 bytes, longer than the 255 this
    file system takes``), or None when each of its names fits."""
    longest = longest_name(path)
    for name in path.parts:
        size = len(os.fsencode(name))
        if size > longest:
            shown = shortened(name, SHOWN_NAME)
            return f"its name {shown} is {size} bytes, longer than the {longest} this file system takes"
    return None


def name_too_long_error(exc: BaseException) -> NameTooLongError | None:
    """The one line (exit 2) of an ``OSError`` the system raised for a path too long (``ENAMETOOLONG``), naming
    the path and what is too long in it; None for any other error (the caller's own line applies)."""
    if not isinstance(exc, OSError) or exc.errno != errno.ENAMETOOLONG:
        return None
    if exc.filename is None:
        return NameTooLongError(f"A path is longer than the file system takes ({exc.strerror}); give a shorter one.")
    path = Path(os.fsdecode(exc.filename))
    problem = name_too_long(path) or (
        f"it is {len(os.fsencode(path))} bytes, which the file system refuses ({exc.strerror})"
    )
    return NameTooLongError(
        f"Cannot use the path {path}: {problem}. Rename the file (or folder) to a shorter name, or give another.",
        path=str(path),
    )


def not_a_file(path: Path) -> str | None:
    """What is at ``path`` when it is not a file to read, in words (``is a folder``, ``is a symbolic link to
    loopB, in a loop of links that leads back to itself``, ``is a symbolic link to x.csv, which does not
    exist``); None when nothing is there (the caller's "not found"), or when it is a file.

    >>> not_a_file(Path("/"))
    'is a folder'
    """
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise  # not a missing file: name_too_long_error's line, where the command's errors end
        if exc.errno == errno.ELOOP:
            loop = "in a loop of links that leads back to itself"
            if path.is_symlink():
                return f"is a symbolic link to {os.readlink(path)}, {loop}"
            return f"goes through a symbolic link {loop}"
        if path.is_symlink():
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        return None
    if path.is_dir():
        return "is a folder"
    return None if path.is_file() else "is not a regular file (a device, a pipe or a socket)"
