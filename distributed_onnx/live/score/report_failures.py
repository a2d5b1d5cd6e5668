"""The live report's requests and failures: each model's failure rate by kind, and the reasons behind them.

Read from ``summary.json``'s ``requests`` (the writers' counts, :mod:`distributed_onnx.live.score.failure_rates`)
and ``failures.parquet`` (the log's failures table grouped by reason), so the page says how often a model did not
answer beside how well it forecast when it did. A log that predates the counts says so instead of showing zeros.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.report.tables import escape
from distributed_onnx.live.log.failures import KINDS

#: The reasons listed at most (the most frequent first); the rest are in failures.parquet.
MAX_REASONS = 30


def requests_table(summary: dict[str, Any]) -> str:
    """Per model: requests, answered, failed by kind, failure rate; and the requests of no known model."""
    requests: dict[str, Any] = summary.get("requests") or {}
    if not requests.get("recorded"):
        return (
            "<p>(failed requests are not recorded in this log: it was written by a service that predates them, "
            "so no failure rate is known)</p>"
        )
    rows = list((requests.get("models") or {}).items())
    unattributed = requests.get("unattributed") or {}
    if unattributed.get("requests"):
        rows.append(("(model not known)", unattributed))
    # Two header rows, "failed" over its kinds: each kind's column named "failed: ..." scrolled sideways at 1280 px.
    top = "".join(f"<th rowspan='2'>{name}</th>" for name in ("model", "requests", "answered"))
    top += f"<th colspan='{len(KINDS)}'>failed</th>"
    top += "".join(f"<th rowspan='2'>{name}</th>" for name in ("failure rate", "failure rows dropped by the log"))
    under = "".join(f"<th>{escape(kind.replace('_', ' '))}</th>" for kind in KINDS)
    body = ""
    for model, counts in rows:
        rate = counts.get("failure_rate")
        by_kind = counts.get("failed_by_kind") or {}
        cells = [counts.get("requests", 0), counts.get("answered", 0), *(by_kind.get(kind, 0) for kind in KINDS)]
        cells += ["-" if rate is None else f"{100 * rate:.2f}%", counts.get("failure_rows_dropped", 0)]
        body += f"<tr><th>{escape(model)}</th>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>"
    return (
        f"<table class='fit'><tr>{top}</tr><tr>{under}</tr>{body}</table>"
        "<p class='hint'>Requests the service answered or failed, by the replicas' own "
        "counts. Failure rate = failed / requests. Validation: refused as invalid (4xx); admission: the replica "
        "was full (503 + Retry-After); model error: the model failed on valid input (500); internal: any other "
        "5xx; cancelled: the client went away. Model not known: failed before a served model was named (a body "
        "refused unread, malformed JSON, an unknown model), in no model's rate.</p>"
    )


def reasons_table(reasons: pa.Table | None) -> str:
    """The most frequent reasons of the failures table: model, kind, reason, status, protocol, count, last message."""
    if reasons is None or not reasons.num_rows:
        return "<p>(no failed request in the log's failures table)</p>"
    body = ""
    for row in reasons.slice(0, MAX_REASONS).to_pylist():
        cells = [
            row["model"] or "(not known)",
            row["kind"],
            row["reason"],
            row["status"],
            row["protocol"],
            row["endpoint"],
            row["count"],
            row["last"].isoformat(timespec="seconds") if row["last"] is not None else "-",
            row["message"],
        ]
        body += "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in cells) + "</tr>"
    # Where and when in one column each, the message left-aligned and wrapped: nine columns scrolled sideways.
    head = ["model", "kind", "reason", "status", "protocol", "endpoint", "count", "last", "latest message"]
    more = reasons.num_rows - MAX_REASONS
    note = f" {more} more reasons in failures.parquet." if more > 0 else ""
    return (
        "<table class='fit reasons'><tr>"
        + "".join(f"<th>{name}</th>" for name in head)
        + f"</tr>{body}</table><p class='hint'>From the log's failures table (one row per failed request, "
        f"never its body), grouped; all of it in failures.parquet.{note}</p>"
    )
