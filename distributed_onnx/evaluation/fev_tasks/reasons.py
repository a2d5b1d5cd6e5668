"""The words a fev benchmark says of what went wrong: a pair's reason (an exception on one line, its secrets
masked) and the one line of a benchmark whose pairs failed or were rejected.

Pure, and shared by the plan (a task whose data fev could not load), the scoring (fev refusing a task) and the
runner (the benchmark's closing error), so each says it the same way.
"""

from __future__ import annotations

from typing import Any

from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.summary_files import SUMMARIES_JSONL
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text


def unfinished_line(failed: list[dict[str, Any]], rejected: list[dict[str, Any]], output: Location) -> str:
    """The one line of a benchmark with failed or rejected pairs: how many, the first of each, what to do (only a
    failed pair is worth a rerun: a rejected one is rejected again)."""
    said, todo = [], []
    for pairs, what, action in (
        (failed, "failed", "rerun to retry the failed ones"),
        (rejected, "rejected", "fix or drop the rejected tasks (a rerun rejects them again)"),
    ):
        if pairs:
            first = pairs[0]
            said.append(
                f"{len(pairs)} task x checkpoint pair(s) {what} (e.g. {first['task']} x {first['model']}: "
                f"{first['reason']})"
            )
            todo.append(action)
    return f"{'; '.join(said)}; the others' summaries are in {output / SUMMARIES_JSONL}; {' and '.join(todo)}"


def pair_reason(exc: BaseException, location: Location | None = None) -> str:
    """An exception as a pair's reason: its class and its message on one line (a URL's secrets masked, those of
    the task's dataset ``location`` in any form a library quoted them). A library's words are cut at 300
    characters; this package's own (a :class:`DistributedOnnxError`) are sentences written to be read whole, whose
    advice comes last, and are cut only past 600."""
    text = " ".join(str(exc).split())
    cut = 600 if isinstance(exc, DistributedOnnxError) else 300
    return f"{type(exc).__name__}: {(location.scrub(text) if location is not None else redact_text(text))[:cut]}"
