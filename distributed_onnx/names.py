"""Names are not paths: the one decision whether a name may become one component of a path, and a join that keeps
what it builds under its root.

A model name arrives from outside: an object key of a repository listing (``...onnx`` is the stem ``..``), a v2
URL (``/v2/models/%2e%2e/ready`` is ``..`` once decoded), a request body, a checkpoint's file name. Every place
that builds a file or folder from one (the serve repository and its download cache, the forecast log's
``model=NAME`` folders, the backtest's ``forecasts/model=NAME/``, export's output) asks :func:`component_problem`
first, or builds the path with :func:`join_under`, so nothing is written, read or deleted outside the folder it
belongs to, whatever the name.
"""

from __future__ import annotations

import re
from pathlib import Path

from distributed_onnx.errors import ConfigError

#: Longer names are refused: most filesystems stop at 255 bytes per component, and the longest component built
#: from a name is the forecast log's ``model=`` folder with the name percent-quoted (up to 3 bytes per byte):
#: 6 + 3 x 80 = 246.
MAX_NAME_BYTES = 80

_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeNameError(ConfigError):
    """A name that cannot be one component of a path (``..``, a separator, a control character, ...)."""


def component_problem(name: object) -> str | None:
    """Why ``name`` may not be one component of a path, or ``None`` when it may.

    Refused: a non-string, the empty name, ``.`` and ``..``, a name with ``/`` or ``\\`` (a separator on some
    system) or ``%`` (an object store's URL decodes ``%2e%2e`` to ``..``), NUL or another control character,
    a drive letter (``C:``), a name over :data:`MAX_NAME_BYTES` bytes in UTF-8, or one that does not encode to
    UTF-8 (a lone surrogate).
    """
    if not isinstance(name, str):
        return f"a name must be a string, got {type(name).__name__}"
    if name in ("", ".", ".."):
        return "it is empty, '.' or '..'" if name else "it is empty"
    if "/" in name or "\\" in name:
        return "it holds a path separator ('/' or '\\')"
    if "%" in name:  # an object store's URL decodes %XX: '%2e%2e' is '..' there, '%2f' a separator
        return "it holds '%' (a URL would decode '%2e%2e' to '..' and '%2f' to '/')"
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        return "it holds a control character"
    if _DRIVE.match(name):
        return "it starts with a drive letter"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return f"it is {size} bytes long (at most {MAX_NAME_BYTES})"
    return None


def is_safe(name: object) -> bool:
    """Whether ``name`` may be one component of a path (:func:`component_problem` finds nothing)."""
    return component_problem(name) is None


def check(name: str, *, what: str = "name", key: str | None = None) -> str:
    """``name`` itself when it may be a path component; :class:`UnsafeNameError` (exit 2) naming why otherwise."""
    problem = component_problem(name)
    if problem is not None:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise UnsafeNameError(f"{what} {shown} cannot be a file or folder name: {problem}", key=key)
    return name


def join_under(root: Path, *names: str, what: str = "name") -> Path:
    """``root / name / ...`` after checking each name, refusing a result that resolves outside ``root``.

    The second check (symbolic links resolved) holds even where a name passed the first: a link inside the root
    that points out of it is not followed to write or delete there.
    """
    path = root.joinpath(*(check(name, what=what) for name in names))
    base = root.resolve()
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise UnsafeNameError(f"{what} {'/'.join(names)!r} resolves outside {root}")
    return path
