"""Whether the forecast log can be written, said where the person who started ``serve`` looks.

A log that cannot write drops every forecast, counted as ``write_failed`` on ``/metrics`` and in the log's own
record; but requests still answer 200, so nothing else shows it. Two defects hid one this way: a log at
``s3://bucket/logs?endpoint_override=...`` wrote to AWS (its folder had been found by cutting the URL at its
last ``/``, which dropped the query) while the ready line said the log was on, and the writer's warnings went to
a replica's logger, which Serve keeps off the console. So:

- :func:`check_writable` writes (and removes) a probe file where the log goes before ``serve`` starts: a log that
  cannot write stops the command with one line naming it (redacted), instead of a ready line that claims it;
- :func:`warn_on_console` sends the log's warnings (a write that failed later, a queue that filled up) to the
  process's own stderr, which Ray streams to ``serve``'s console with the replica's name.
"""

from __future__ import annotations

import logging
import sys
import uuid
from typing import TextIO

from distributed_onnx.errors import StorageError
from distributed_onnx.live.log.layout import STATE_DIR
from distributed_onnx.live.log.writer import StorageSink
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.redact import redact_text

__all__ = ["check_writable", "warn_on_console"]

#: The logger whose records :func:`warn_on_console` shows: the writer's and its recorders'.
LOG_LOGGER = "distributed_onnx.live.log"


def check_writable(root: LocationLike) -> None:
    """Write a probe file under ``root/_log_state/`` with the log's own sink, then remove it.

    Raises :class:`StorageError` (exit 3) naming the log, what failed and what to do.
    """
    place = Location.parse(root)
    probe = place / STATE_DIR / f".probe-{uuid.uuid4().hex}.json"
    try:
        StorageSink().write_bytes(probe, b"{}")
    except Exception as exc:  # any store's error: the log cannot write, whatever the reason
        raise StorageError(
            f"Cannot write the forecast log {place}: {type(exc).__name__}: {redact_text(str(exc))}. serve did not "
            "start, as every forecast would be dropped: check the location, its options (a store's endpoint_override, "
            "region, scheme) and its credentials (in the environment), or start serve without --forecast-log.",
            path=str(place),
        ) from None
    from distributed_onnx import storage

    try:
        storage.delete(probe)
    except Exception:  # a probe left behind is harmless: scoring reads only day=*/ and _log_state/*.json
        logging.getLogger(__name__).debug("Could not remove the forecast log's probe %s", probe)


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """WARNING and above, one redacted line each, on a stream of the process's own."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("warning: %(message)s"))

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def warn_on_console(stream: TextIO | None = None) -> None:
    """Show the log's warnings on ``stream`` (default: the process's own stderr, ``sys.__stderr__``; in a Serve
    replica ``sys.stderr`` is Serve's logger, which a quiet ``serve`` keeps in files). Idempotent."""
    target = stream or sys.__stderr__ or sys.stderr
    logger = logging.getLogger(LOG_LOGGER)
    if not any(isinstance(handler, _ConsoleHandler) for handler in logger.handlers):
        logger.addHandler(_ConsoleHandler(target))
