"""Names are not paths: the one rule for a model's name (a checkpoint's file stem), which becomes one component of
paths, and a join that keeps what it builds under its root.

A model name arrives from outside: an object key of a repository listing (``...onnx`` is the stem ``..``), a v2
URL (``/v2/models/%2e%2e/ready`` is ``..`` once decoded), a request body, a checkpoint's file name, an export's
``--output``. Every place that takes one (``backtest`` and ``fev`` before Ray starts, ``serve``'s checkpoints and
its repository and download cache, the forecast log's ``model=NAME`` folders, the backtest's
``forecasts/model=NAME/``, ``export --output`` before the export starts) asks :func:`name_problem`, or builds the
path with :func:`join_under`, so that a checkpoint one command writes every other command takes, and nothing is
written, read or deleted outside the folder it belongs to, whatever the name.

The rule, one line each in :func:`name_problem`'s answer (the one it breaks, never a list of those it meets):

- 1 to :data:`MAX_NAME_BYTES` bytes;
- letters (ASCII), digits, ``.``, ``_`` and ``-`` only: no separator, no ``%`` (an object store's URL decodes
  ``%2e%2e`` to ``..``), no space, quote or control character, no drive letter's ``:``;
- the first character a letter or a digit: no hidden file (``.x``, ``..``), nothing a shell reads as an option
  (``-rf``);
- not a name every scored run gives its baselines (:data:`BASELINE_NAMES`): their rows would mix with the model's.
"""

from __future__ import annotations

import re
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.redact import redact_name

#: Longer names are refused: most filesystems stop at 255 bytes per component, and the longest component built
#: from a name is the forecast log's ``model=`` folder with the name percent-quoted (up to 3 bytes per byte):
#: 6 + 3 x 80 = 246.
MAX_NAME_BYTES = 80
#: The names of the baselines every backtest and ``score`` scores beside the models (seasonal naive, the reference
#: of skill, and its quantiles): defined here, the names' one home, and used by the scoring
#: (``evaluation/scoring/pairs.py``), so that a model can never be named as one.
BASELINE_NAMES = ("seasonal_naive", "seasonal_quantiles")

_ALLOWED = re.compile(r"[A-Za-z0-9._-]")
_FIRST = re.compile(r"[A-Za-z0-9]")
#: What the rule says, for messages: the whole of it in one phrase.
RULE = f"a name is 1 to {MAX_NAME_BYTES} bytes of letters, digits, '.', '_' and '-', starting with a letter or a digit"


class UnsafeNameError(ConfigError):
    """A name the rule refuses (``..``, a separator, a leading ``-``, over 80 bytes, a baseline's name, ...)."""


def name_problem(name: object) -> str | None:
    """The one part of the rule (module docstring) ``name`` breaks, or ``None`` when it may be a model's name."""
    if not isinstance(name, str):
        return f"a name is a string, got {type(name).__name__}"
    if not name:
        return "it is empty"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8 (a lone surrogate)"
    if size > MAX_NAME_BYTES:
        return f"it is {size} bytes long; a name is at most {MAX_NAME_BYTES} bytes"
    odd = next((char for char in name if not _ALLOWED.fullmatch(char)), None)
    if odd is not None:
        return f"it holds {_shown(odd)}; a name holds only letters (A-Z, a-z), digits, '.', '_' and '-'"
    if not _FIRST.fullmatch(name[0]):
        return f"it starts with {name[0]!r}; a name starts with a letter or a digit"
    if name in BASELINE_NAMES:
        return f"it is a baseline's name (every run scores {', '.join(BASELINE_NAMES)} beside the models)"
    return None


def _shown(char: str) -> str:
    """A refused character as a reader can see it: its own repr, and its name for the ones that look alike."""
    words = {"/": "a path separator '/'", "\\": "a path separator '\\\\'", " ": "a space", "%": "'%' (a URL would "
             "decode '%2e%2e' to '..')", ":": "':' (a drive letter's, a URL's)"}  # fmt: skip
    if char in words:
        return words[char]
    if ord(char) < 32 or ord(char) == 127:
        return f"a control character {char!r}"
    return repr(char)


def is_safe(name: object) -> bool:
    """Whether ``name`` may be a model's name (:func:`name_problem` finds nothing)."""
    return name_problem(name) is None


def check(name: str, *, what: str = "name", key: str | None = None, fix: str = "") -> str:
    """``name`` itself when the rule takes it; :class:`UnsafeNameError` (exit 2) naming the part it breaks (and
    ``fix``, what to do about it)."""
    problem = name_problem(name)
    if problem is not None:
        raise UnsafeNameError(f"{what} {quoted(name)} is refused: {problem}{f'; {fix}' if fix else ''}", key=key)
    return name


def quoted(name: object) -> str:
    """``name`` as a message quotes it: its repr, bounded, with what follows a ``?`` or ``#`` masked
    (:func:`~distributed_onnx.redact.redact_name`: a stem cut from a URL-like path may hold its options' secrets)."""
    shown = repr(redact_name(name) if isinstance(name, str) else name)
    return shown if len(shown) <= 100 else shown[:97] + "..."


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
