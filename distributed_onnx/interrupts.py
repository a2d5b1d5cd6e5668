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

Python reports such a swallowed exception through :data:`sys.unraisablehook`, whose default prints ``Exception
ignored in: ...``, the traceback through the handler, and ``KeyboardInterrupt``: an outside attack saw it before
``serve``'s one line when a SIGTERM landed in the few statements by which the first Cython module of the imports
(Ray's) registers its types with ``collections.abc``, Cython then warning ``RuntimeWarning: Cython module failed
to patch module with custom type`` for the registration the interrupt cut short. The first recorded interrupt
puts :class:`QuietSwallowedInterrupts` in front of the hook: an interrupt of the record is swallowed without a
word (the record stops the command), and from then on that warning of Cython's, a consequence of the interrupt
and of an import the command is about to leave, is not shown either; every other unraisable exception and every
other warning is shown as before.

A foundation module: it imports nothing of the package, so it is in force before anything heavy is imported.
"""

from __future__ import annotations

import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
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


@dataclass(frozen=True)
class Arrival:
    """An interrupt a handler of this module raised: the signal's name and the very exception raised (the one the
    unraisable hook knows as ours)."""

    signal_name: str
    interrupt: KeyboardInterrupt


#: The interrupts raised by this module's handlers and not yet handled, first first.
_arrived: list[Arrival] = []

#: Cython's warnings when an interrupt cut short its registration of a module's types with ``collections.abc`` (its
#: two wordings): hidden once an interrupt of the record was swallowed (:class:`QuietSwallowedInterrupts`).
CUT_SHORT_CYTHON_PATCH = r"Cython module failed to (patch module with custom type|register with collections)"


def record(signum: int, words: str) -> KeyboardInterrupt:
    """The interrupt a handler is to raise (``words`` its message; none for Ctrl-C's, as Python's own), kept for the
    checkpoints that a swallowed one must still stop, and for the unraisable hook that keeps it quiet."""
    interrupt = KeyboardInterrupt(words) if words else KeyboardInterrupt()
    _arrived.append(Arrival(signal.Signals(signum).name, interrupt))
    if not isinstance(sys.unraisablehook, QuietSwallowedInterrupts):
        sys.unraisablehook = QuietSwallowedInterrupts(sys.unraisablehook)
    return interrupt


def arrived() -> str | None:
    """The name of the first interrupt recorded and not yet handled (``"SIGINT"``, ``"SIGTERM"``), or ``None``."""
    return _arrived[0].signal_name if _arrived else None


def forget() -> None:
    """The interrupt was handled (its line printed, or the part that stops on it took it): the record is done."""
    _arrived.clear()


def raise_if_arrived() -> None:
    """A checkpoint: raise again the interrupt recorded, whose ``KeyboardInterrupt`` may have been swallowed."""
    if _arrived:
        raise KeyboardInterrupt(*_arrived[0].interrupt.args)


@dataclass(frozen=True)
class QuietSwallowedInterrupts:
    """:data:`sys.unraisablehook` in front of ``previous``: an interrupt of the record that Python could not raise
    (a finalizer, a ``__del__``, Cython's import-time registration) is swallowed without a word, because the record
    stops the command at its next checkpoint with its one line; anything else goes to ``previous`` as before."""

    previous: Callable[[Any], object]

    def __call__(self, unraisable: Any) -> None:
        if any(unraisable.exc_value is arrival.interrupt for arrival in _arrived):
            warnings.filterwarnings("ignore", CUT_SHORT_CYTHON_PATCH, RuntimeWarning)
            return
        self.previous(unraisable)


@dataclass(frozen=True)
class SigtermInterrupt:
    """SIGTERM's handler: the main thread gets a ``KeyboardInterrupt`` carrying ``words`` (what the line says)."""

    words: str

    def __call__(self, signum: int, frame: Any) -> NoReturn:
        raise record(signum, self.words)


def sigint_interrupt(signum: int, frame: Any) -> NoReturn:
    """SIGINT's handler: Python's own (a bare ``KeyboardInterrupt``), recorded."""
    raise record(signum, "")


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
