"""An export's progress: one line on stderr (the log) per phase, with the seconds since the export began.

A published model's export runs long (tracing, optimizing, writing its weights, the parity report); each phase
says so as it starts, so the user sees which one is running rather than nothing. The dispatch starts the clock
(:func:`start_progress`); the exporters and the shared export code mark their phases (:func:`phase`).
"""

from __future__ import annotations

import contextvars
import logging
import time

logger = logging.getLogger(__name__)

#: When the export began (:func:`start_progress`), for the elapsed seconds of each phase's line.
_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar("export_started", default=None)


def start_progress() -> None:
    """Start the clock of :func:`phase`'s elapsed seconds (one export)."""
    _STARTED.set(time.perf_counter())


def phase(what: str) -> None:
    """One line on stderr (the log) per phase of an export, with the seconds since it began: a published
    TiRex takes minutes, and the user sees which phase it is in rather than nothing."""
    started = _STARTED.get()
    if started is None:
        start_progress()
        started = _STARTED.get()
    assert started is not None
    logger.info("export: %s (%.1f s)", what, time.perf_counter() - started)
