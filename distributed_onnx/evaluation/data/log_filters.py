"""Logging filters for reading a table in pieces: each warning of the table reader once, or none at all.

The load stage's streamed scan (:mod:`distributed_onnx.evaluation.dataset`) checks its input chunk by chunk with
the whole-table reader's code, which warns about the input (undeclared columns, ...): once per chunk would repeat
it hundreds of times. An actor reading
rows the driver checked already (:mod:`.rows`) repeats none of them.
"""

from __future__ import annotations

import logging


class once_per_message:  # noqa: N801 - a context manager used as a function
    """While scanning, each warning of the table reader is logged once (not once per chunk)."""

    def __init__(self, target: logging.Logger) -> None:
        self.target = target
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True

    def __enter__(self) -> None:
        self.target.addFilter(self.filter)

    def __exit__(self, *exc: object) -> None:
        self.target.removeFilter(self.filter)


class silenced(once_per_message):  # noqa: N801
    """While reading rows the driver checked, the table reader's warnings are not repeated."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING
