"""Ctrl-C and SIGTERM end a command with one line and exit 130, from its first moment to its last.

A command ends on an interrupt where it is: Ctrl-C raises ``KeyboardInterrupt`` (Python's own handler), and SIGTERM
raises it too once :func:`interrupt_on_sigterm` has set :class:`SigtermInterrupt` (Python's default for SIGTERM
ends the process at once: exit 143, no line, no ``finally``). The CLI turns the interrupt into its line
(:func:`interrupted_line`) and exit 130. The console script (:func:`distributed_onnx.__main__.run`) sets the
SIGTERM handler first thing and catches the interrupt around everything after it, because the CLI and what it
imports (its settings, numpy, pyarrow) take a while to import: an interrupt there printed Python's traceback, and a
SIGTERM there exited 143 without a word. The parts that need their own words or their own stop set their own
handler and put this one back after (an export, ``serve``); the backtest's (:mod:`.runtime.early_start`) replaces
it for the rest of the run.

Every interrupt these handlers raise is also recorded (:func:`arrived`), because a ``KeyboardInterrupt`` raised at
an arbitrary moment can be swallowed: Python only prints and ignores an exception raised where it cannot propagate
(a module's finalizer, a ``__del__``, a weak reference's callback), and an outside attack saw ``serve``, Ctrl-C'd
while it imported, print ``Exception ignored in: <module 'collections.abc'> ... KeyboardInterrupt`` and go on to
serve. The command checks the record at its checkpoints (:func:`raise_if_arrived`: the CLI before the command
runs; ``serve`` before Ray starts, before the deploy, before its ``ready:`` line), so a swallowed interrupt still
ends it with its line and exit 130. The handling of the interrupt clears the record (:func:`forget`).

A foundation module: it imports nothing of the package, so it is in force before anything heavy is imported.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

#: The exit code of an interrupted command (the CLI's table).
EXIT_INTERRUPTED = 130

#: The commands a rerun resumes (finished parts, scored batches are kept): only their lines say so.
RESUMING_COMMANDS = frozenset({"backtest", "score"})


def command_given(argv: Sequence[str]) -> str | None:
    """The command in ``argv``: its first word that is not an option (the top level's options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def interrupted_line(interrupted: KeyboardInterrupt, *, resumes: bool) -> str:
    """The line (without ``error:``) for an interrupted command: the interruption's own words when it has them
    (SIGTERM, an export stopped by it), else what to do. Ctrl-C's ``KeyboardInterrupt`` has no words: its ``str`` is
    empty (the exception itself is always true, so ``interrupted or ...`` printed ``error:`` alone)."""
    words = " ".join(str(interrupted).split())
    again = "; rerun the same command to resume" if resumes else ""
    return words or f"interrupted{again}"


#: The interrupts raised by this module's handlers and not yet handled: (the signal's name, the words raised).
_arrived: list[tuple[str, str]] = []


def record(signum: int, words: str) -> None:
    """Keep the interrupt a handler is about to raise, for the checkpoints that a swallowed one must still stop."""
    _arrived.append((signal.Signals(signum).name, words))


def arrived() -> str | None:
    """The name of the first interrupt recorded and not yet handled (``"SIGINT"``, ``"SIGTERM"``), or ``None``."""
    return _arrived[0][0] if _arrived else None


def forget() -> None:
    """The interrupt was handled (its line printed, or the part that stops on it took it): the record is done."""
    _arrived.clear()


def raise_if_arrived() -> None:
    """A checkpoint: raise again the interrupt recorded, whose ``KeyboardInterrupt`` may have been swallowed."""
    if _arrived:
        raise KeyboardInterrupt(_arrived[0][1]) if _arrived[0][1] else KeyboardInterrupt


@dataclass(frozen=True)
class SigtermInterrupt:
    """SIGTERM's handler: the main thread gets a ``KeyboardInterrupt`` carrying ``words`` (what the line says)."""

    words: str

    def __call__(self, signum: int, frame: Any) -> NoReturn:
        record(signum, self.words)
        raise KeyboardInterrupt(self.words)


def sigint_interrupt(signum: int, frame: Any) -> NoReturn:
    """SIGINT's handler: Python's own (a bare ``KeyboardInterrupt``), recorded."""
    record(signum, "")
    raise KeyboardInterrupt


def interrupt_on_sigint() -> None:
    """Ctrl-C raises a recorded ``KeyboardInterrupt`` (:func:`sigint_interrupt`), only where SIGINT has Python's
    own handler (an ignored SIGINT, a handler already set, stay as they are); only the main thread can set one."""
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, sigint_interrupt)


def sigterm_words(*, resumes: bool) -> str:
    """What a command that SIGTERM stopped says: the same words as Ctrl-C's line, naming the signal."""
    return "interrupted by SIGTERM" + ("; rerun the same command to resume" if resumes else "")


def interrupt_on_sigterm(*, resumes: bool) -> None:
    """SIGTERM raises ``KeyboardInterrupt`` (:class:`SigtermInterrupt`) in the main thread, as Ctrl-C does. Only
    where SIGTERM still has Python's default: a handler already set (an embedding program's, Ray's) or an ignored
    SIGTERM stays as it is; only the main thread can set one."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, SigtermInterrupt(sigterm_words(resumes=resumes)))


def is_ours(handler: object) -> bool:
    """Whether ``handler`` is the one :func:`interrupt_on_sigterm` set: a part with its own words may replace it."""
    return isinstance(handler, SigtermInterrupt)
