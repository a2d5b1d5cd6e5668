"""Each model's failure rate beside its accuracy: requests answered and failed (by kind), and the reasons.

Two sources, each for what it is exact about (:mod:`distributed_onnx.live.log.failures`):

- the rates come from the writers' records (``_log_state``, format 2 and later): every request a replica
  answered or failed is counted there, even when the log dropped its row; rate = failed / (answered + failed),
  overall and per kind. Requests whose model was never known (a body refused before it was read, malformed
  JSON, an unknown model name) are counted apart (``unattributed``): no model's rate includes them;
- the reasons come from the failures table: rows grouped by model, kind, reason, status and protocol, with their
  count, first and last time and the latest message (``failures.parquet`` of ``score``'s output).

A log whose records all predate format 2 says nothing of failures: :func:`request_counts` returns no model and
``recorded`` False, and the report says so rather than showing a rate of zero. The table is read whole on every
run (one small row per failed request; the forecasts are read incrementally because they are large).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from distributed_onnx.live.log.failures import FAILURE_SCHEMA, KINDS, read_failures
from distributed_onnx.location import Location

#: The columns a failure reason is grouped by (and, with the counts, the columns of ``failures.parquet``).
REASON_KEYS = ("model", "kind", "reason", "status", "protocol", "endpoint")
FAILURES_FILE = "failures.parquet"


@dataclass
class RequestCounts:
    """Requests of one model (or the unattributed ones) by outcome, summed over the log's writers."""

    answered: int = 0
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    rows_logged: int = 0
    rows_dropped: int = 0

    def add(self, record: Mapping[str, Any]) -> None:
        self.answered += int(record.get("requests_answered") or 0)
        for kind, value in dict(record.get("requests_failed") or {}).items():
            self.failed[str(kind)] = self.failed.get(str(kind), 0) + int(value)
        self.rows_logged += int(record.get("failures_logged") or 0)
        self.rows_dropped += int(record.get("failures_dropped") or 0)

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` holds: the counts, the rate overall and per kind (None without any request)."""
        failed = sum(self.failed.values())
        requests = self.answered + failed
        return {
            "requests": requests,
            "answered": self.answered,
            "failed": failed,
            "failed_by_kind": dict(self.failed),
            "failure_rate": failed / requests if requests else None,
            "failure_rate_by_kind": {kind: (n / requests if requests else None) for kind, n in self.failed.items()},
            "failure_rows_logged": self.rows_logged,
            "failure_rows_dropped": self.rows_dropped,
        }


@dataclass
class FailureSummary:
    """The log's requests and failures: per model, unattributed, and whether the log records them at all."""

    recorded: bool
    models: dict[str, RequestCounts]
    unattributed: RequestCounts

    def record(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "models": {model: counts.record() for model, counts in sorted(self.models.items())},
            "unattributed": self.unattributed.record(),
        }


def request_counts(states: Iterable[Mapping[str, Any]]) -> FailureSummary:
    """Requests answered and failed per model, from the writers' records that count them (format 2 and later)."""
    models: dict[str, RequestCounts] = {}
    unattributed = RequestCounts()
    recorded = False
    for state in states:
        if int(state.get("format") or 1) < 2:
            continue  # written before requests were counted: its models' rates are not known
        recorded = True
        for model, record in dict(state.get("models") or {}).items():
            models.setdefault(str(model), RequestCounts()).add(record)
        unattributed.add(dict(state.get("unattributed") or {}))
    return FailureSummary(recorded, models, unattributed)


def failure_reasons(root: Location) -> tuple[pa.Table, dict[str, str]]:
    """The failures table grouped by :data:`REASON_KEYS`: ``count``, ``first`` and ``last`` request time and the
    latest ``message``, most frequent first; and the table's files that could not be read (name: why)."""
    table, unreadable = read_failures(root)
    if not table.num_rows:
        return _empty_reasons(), unreadable
    table = table.sort_by([("request_time", "ascending")])
    grouped = table.group_by(list(REASON_KEYS), use_threads=False).aggregate(
        [
            ("request_time", "count"),
            ("request_time", "min"),
            ("request_time", "max"),
            ("message", "last"),
        ]
    )
    renamed = grouped.rename_columns(
        {
            "request_time_count": "count",
            "request_time_min": "first",
            "request_time_max": "last",
            "message_last": "message",
        }
    )
    ordered = renamed.select([*REASON_KEYS, "count", "first", "last", "message"])
    return ordered.sort_by([("count", "descending"), ("last", "descending")]), unreadable


def _empty_reasons() -> pa.Table:
    fields = [FAILURE_SCHEMA.field(name) for name in REASON_KEYS]
    time = FAILURE_SCHEMA.field("request_time").type
    counts = [pa.field("count", pa.int64()), pa.field("first", time), pa.field("last", time)]
    return pa.schema([*fields, *counts, pa.field("message", pa.string())]).empty_table()
