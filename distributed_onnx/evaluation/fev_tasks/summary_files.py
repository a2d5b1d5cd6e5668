"""The files a fev benchmark writes at its end: fev's summaries (``summaries.jsonl``, ``summaries.json``), the
state of every pair (``fev_summary.json``) and ``fev.leaderboard``'s table (``leaderboard.csv``).

Their names and their writing are one module, apart from the runner that decides what goes in them, so that the
runner and the reasons that point at them (:mod:`.reasons`) name the same files.
"""

from __future__ import annotations

import json
from typing import Any

from distributed_onnx import storage
from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.fev_import import FEV_VERSION
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text, redacted

#: What happened to a task x checkpoint: computed now, taken from an earlier run's record, skipped (the checkpoint
#: cannot serve the task: its horizon, its levels), ``rejected`` (no rerun gets past it: fix or drop the task) or
#: ``failed`` (a rerun retries it).
STATUSES = ("done", "resumed", "skipped", "rejected", "failed")

SUMMARIES_JSONL = "summaries.jsonl"
SUMMARIES_JSON = "summaries.json"
RUN_SUMMARY = "fev_summary.json"
LEADERBOARD = "leaderboard.csv"


def write_outputs(
    output: Location, summaries: list[dict[str, Any]], pairs: list[dict[str, Any]], models: list[str]
) -> None:
    """Write fev's summaries, every pair's state and, with two models or more, fev's leaderboard to ``output``."""
    summaries, pairs = redacted(summaries), redacted(pairs)  # summaries an earlier version wrote, too
    lines = "".join(json.dumps(summary) + "\n" for summary in summaries)
    storage.write_bytes(storage.join(output, SUMMARIES_JSONL), lines.encode())
    storage.write_bytes(storage.join(output, SUMMARIES_JSON), json.dumps(summaries).encode())
    counts = {status: sum(p["status"] == status for p in pairs) for status in STATUSES}
    document: dict[str, Any] = {"fev_version": FEV_VERSION, "models": models, "pairs": pairs, "counts": counts}
    names = {summary["model_name"] for summary in summaries}
    if len(names) >= 2 and summaries:
        try:
            served = [summary["model_name"] for summary in summaries]
            baseline = max(models, key=served.count)  # fev needs the baseline on every task; the first of the most
            board = _leaderboard(summaries, baseline=baseline)
        except (DistributedOnnxError, ValueError, KeyError) as exc:
            document["leaderboard_error"] = redact_text(f"{type(exc).__name__}: {exc}")
        else:
            storage.write_bytes(storage.join(output, LEADERBOARD), board.encode())
    storage.write_bytes(storage.join(output, RUN_SUMMARY), json.dumps(document, indent=2).encode())


def _leaderboard(summaries: list[dict[str, Any]], baseline: str) -> str:
    """``fev.leaderboard`` of the summaries against ``baseline``, as CSV (tasks a model lacks are dropped)."""
    from distributed_onnx.evaluation.fev_tasks.fev_import import load_fev

    fev = load_fev()
    board = fev.leaderboard(summaries, baseline_model=baseline, missing_strategy="drop")
    return str(board.to_csv())
