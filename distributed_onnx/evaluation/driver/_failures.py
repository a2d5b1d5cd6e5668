"""``failed_windows.json``: which windows a run could not forecast, and the one error that says so.

The file describes the latest invocation: a rerun that fails again rewrites it, and one that finishes every
window removes it (the report stage, through :class:`~..outputs.RunFolder`), so it never lists windows that are
done; likewise ``nonfinite_windows.json``.

The driver never holds window ids while a run goes well; only for the parts that failed does it recompute their
windows (from the same pure plan the actors used) so a user can see exactly what is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation.data.windows import PartSpec, plan_series, window_ids
from distributed_onnx.evaluation.planning import RunPlan
from distributed_onnx.location import Location


def part_window_ids(plan: RunPlan, part: PartSpec) -> list[str]:
    """The ids of a part's windows, in plan order."""
    ids: list[str] = []
    if plan.grouping is not None:
        grouped_series, grouped_origins, _ = plan.grouping.windows(part.start, part.stop)
        arrays = plan.table.arrays()
        origins_us = arrays.start_us[grouped_series] + grouped_origins * arrays.step_us
        series_ids = [arrays.series_ids[int(i)] for i in grouped_series]
        return window_ids(series_ids, origins_us, plan.window_fingerprint)
    for series_index, lo, hi in plan.windows.segments(part.start, part.stop):
        series = plan.table.series[series_index]
        origins = plan_series(series, plan.spec).origins[lo:hi]
        origins_us = np.asarray(series.timestamp_us(origins), dtype=np.int64)
        ids += window_ids([series.series_id] * len(origins), origins_us, plan.window_fingerprint)
    return ids


def failure_error(plan: RunPlan, parts: list[PartSpec], failures: list[dict[str, Any]], path: Location) -> BatchError:
    """Add each failed part's window ids to its record (``failed_windows.json``'s rows, written at ``path`` by the
    report stage) and return the error to raise."""
    by_index = {part.index: part for part in parts}
    for failure in failures:
        failure["window_ids"] = part_window_ids(plan, by_index[failure["part"]])
    first = failures[0]
    return BatchError(
        f"{len(failures)} part(s) failed; their window ids are in {path}; rerun to resume. "
        f"First: part {first['part']} ({first['windows']} windows): {first['error']}",
        failed_parts=[failure["part"] for failure in failures],
    )


def nonfinite_error(bad: dict[str, list[str]], path: Location) -> BatchError | None:
    """The one-line error to raise for the windows holding NaN or infinite forecasts (``bad``, per model: what
    ``nonfinite_windows.json`` at ``path`` holds), or None when every forecast was finite.

    A non-finite forecast is a model failure, not a gap: its pairs are left out of every model's scores (the
    run's common pairs), its forecasts are written as they are, and the run exits 1 like a run with failed parts.
    """
    if not bad:
        return None
    counts = ", ".join(f"{model}: {len(ids)}" for model, ids in bad.items())
    total = sum(len(ids) for ids in bad.values())
    return BatchError(
        f"{total} window(s) with non-finite forecasts ({counts}); written as they are, left out of every model's "
        f"scores; their window ids are in {path}",
        failed_batches=[],
    )
