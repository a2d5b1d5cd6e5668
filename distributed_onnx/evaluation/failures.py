"""``failed_windows.json``: which windows a run could not forecast, and the one error that says so.

The file describes the latest invocation: a rerun that fails again rewrites it, and one that finishes every
window removes it (:func:`clear_failed_windows`), so it never lists windows that are done.

The driver never holds window ids while a run goes well; only for the parts that failed does it recompute their
windows (from the same pure plan the actors used) so a user can see exactly what is missing.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation.data.windows import PartSpec, plan_series, window_ids
from distributed_onnx.evaluation.plan import RunPlan

FAILED_WINDOWS = "failed_windows.json"


def part_window_ids(plan: RunPlan, part: PartSpec) -> list[str]:
    """The ids of a part's windows, in plan order."""
    ids: list[str] = []
    for series_index, lo, hi in plan.windows.segments(part.start, part.stop):
        series = plan.table.series[series_index]
        origins = plan_series(series, plan.spec).origins[lo:hi]
        origins_us = np.asarray(series.timestamp_us(origins), dtype=np.int64)
        ids += window_ids([series.series_id] * len(origins), origins_us, plan.window_fingerprint)
    return ids


def failure_error(plan: RunPlan, parts: list[PartSpec], failures: list[dict[str, Any]]) -> BatchError:
    """Write ``failed_windows.json`` (each failed part with its error and window ids) and return the error to raise."""
    by_index = {part.index: part for part in parts}
    for failure in failures:
        failure["window_ids"] = part_window_ids(plan, by_index[failure["part"]])
    path = storage.join(plan.settings.output, FAILED_WINDOWS)
    storage.write_bytes(path, json.dumps(failures, indent=2).encode())
    first = failures[0]
    return BatchError(
        f"{len(failures)} part(s) failed; their window ids are in {path}; rerun to resume. "
        f"First: part {first['part']} ({first['windows']} windows): {first['error']}",
        failed_parts=[failure["part"] for failure in failures],
    )


def clear_failed_windows(output: storage.Location) -> bool:
    """Remove a ``failed_windows.json`` an earlier invocation left, once every window is done; True if there was one."""
    path = storage.join(output, FAILED_WINDOWS)
    if not storage.is_file(path):
        return False
    storage.delete(path)
    return True
