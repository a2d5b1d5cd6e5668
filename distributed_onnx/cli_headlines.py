"""What ``backtest`` and ``score`` print on stdout when they finish: the headline metrics (global, pooled), and
``score``'s failure rates per model.

Pure (rows and summary.json's mappings in, a JSON-ready mapping out), apart from the command handlers
(:mod:`.cli_commands`) that run the work, so that what the two commands print is read and tested alone, and
both print the same rows (:func:`headline_rows`).
"""

from __future__ import annotations

from typing import Any

from distributed_onnx.location import Location


def backtest_headline(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``backtest``'s headline: its windows, its speed, each model's headline metrics (:func:`headline_rows`)."""
    scores = {f"{row['model']}.{row['metric']}": round(row["value"], 4) for row in headline_rows(rows)}
    return {
        "windows": summary["windows"],
        "windows_per_s": summary["timing"]["windows_per_s"],
        "global": scores,
    }


def headline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the metrics table that ``backtest`` and ``score`` print: the global pooled value of each
    headline metric (:func:`~distributed_onnx.evaluation.scoring.registry.headline`)."""
    from distributed_onnx.evaluation.scoring.registry import POOLED, headline

    shown = headline()
    return [
        row
        for row in rows
        if row["scope"] == "global"
        and row["quantile"] is None
        and row["metric"] in shown
        and row.get("convention", POOLED) == POOLED
        and row["value"] is not None
    ]


def failure_headline(requests: dict[str, Any]) -> dict[str, Any] | str:
    """Each model's requests, failures by kind (the non-zero ones) and failure rate, from summary.json."""
    if not requests.get("recorded"):
        return "not recorded (a log written before failures were logged)"
    shown: dict[str, Any] = {}
    for model, counts in [*requests["models"].items(), ("(model not known)", requests["unattributed"])]:
        if counts["requests"]:
            rate = counts["failure_rate"]
            failed = {kind: n for kind, n in counts["failed_by_kind"].items() if n}
            shown[model] = {"requests": counts["requests"], "failed": failed, "failure_rate": round(rate, 4)}
    return shown


def score_headline(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The headline metrics of each model (:func:`headline_rows`), per group of checkpoints scored together."""
    groups: dict[str, dict[str, float]] = {}
    for row in headline_rows(rows):
        groups.setdefault(str(row.get("scored_with")), {})[f"{row['model']}.{row['metric']}"] = round(row["value"], 4)
    return groups


def folder_words(folder: Location) -> str:
    """A written folder as the ``wrote ...`` lines show it: with a trailing ``/``, unless a URL's query ends it
    (``s3://b/run?region=***/`` read as part of the query)."""
    text = str(folder)
    return text if "?" in text else f"{text}/"
