"""Whether Ray's own console lines (its token-authentication notice, start-up lines) show in this process: chosen
once, by the command line, and applied where Ray starts (:func:`~.local_ray.connect`).

Each command used to silence Ray itself, before its own start of Ray: the backtest did, ``fev`` did not, so a
``fev`` run printed Ray's token notice where docs/cli.md promises only our lines without ``-v``. Now the command
line chooses here (``main``, from ``-v``) for every command, and every start or join of Ray goes through
:func:`~.local_ray.connect`, which applies the choice right after Ray's import and before ``ray.init`` logs:
a command that starts Ray cannot forget it. No choice (the Python API) leaves Ray's logging as Ray sets it.
Imports no Ray: the command line chooses before it knows whether Ray will start.
"""

from __future__ import annotations

__all__ = ["choose", "chosen"]

_quiet: bool | None = None


def choose(*, quiet: bool) -> None:
    """Ray's console lines hidden (``quiet``: at ERROR) or shown (``-v``: Ray's own INFO) for every later start."""
    global _quiet  # noqa: PLW0603 - one choice per process, made by its command line
    _quiet = quiet


def chosen() -> bool | None:
    """The choice made (True: quiet), or None where no command line chose (the Python API)."""
    return _quiet
