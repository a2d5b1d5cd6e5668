"""The export's parity check: the upstream pipeline against ONNX Runtime on the same windows, passed or not.

The windows (:func:`parity_windows`: from ``--data`` or seeded), the report (:func:`parity_report`, its statistics
those of :mod:`.parity`), and the verdict (:func:`finish`: beyond :data:`PARITY_TOLERANCE` the checkpoint is removed
and the export fails). A family's graph that computes anything other than upstream's forecast is caught here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, ParityError
from distributed_onnx.export.parity import parity_statistics
from distributed_onnx.export.progress import phase
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.location import Location

logger = logging.getLogger(__name__)

#: ``(context [W, C] float32 with NaN, horizon) -> [W, horizon, n_native]``: the upstream pipeline's forecast.
UpstreamForecast = Callable[[np.ndarray, int], np.ndarray]
#: The largest ``max_rel_diff`` (the largest absolute difference over the largest upstream value) a parity
#: report passes with: the families' graphs reproduce upstream to float32 rounding (1e-7 to 1e-5 measured on the
#: tiny and published models), so 1e-3 only fails a graph that computes something else, or non-finite values.
PARITY_TOLERANCE = 1e-3


def parity_windows(request: ExportRequest, context_length: int, resolution_minutes: int) -> tuple[np.ndarray, str]:
    """``[W, context_length]`` float32 windows for the parity report, and where they came from.

    From ``--data``: the last ``context_length`` steps of its first ``parity_windows`` series (NaN where a
    series is shorter or has gaps). Otherwise seeded sample windows: a daily and a weekly cycle, a trend and
    noise at several levels, with scattered gaps, a run of missing steps and a short history.
    """
    count = request.parity_windows
    if request.data is not None:
        from distributed_onnx.evaluation.data.table import load_series

        source = str(request.data)  # the parity report records it: a URL's secrets stay in the URL
        table = load_series(request.data, resolution_minutes)
        windows = np.full((min(count, len(table.series)), context_length), np.nan, dtype=np.float32)
        for row, series in enumerate(table.series[: windows.shape[0]]):
            tail = np.asarray(series.values[-context_length:], dtype=np.float32)
            windows[row, context_length - tail.size :] = tail
        if not windows.shape[0]:
            raise ConfigError(f"--data {source} holds no series to compare on", key="data")
        return windows, source
    rng = np.random.default_rng(0)
    steps = np.arange(context_length)
    level = rng.uniform(-50.0, 500.0, size=(count, 1))
    cycles = rng.uniform(1.0, 30.0, size=(count, 1)) * np.sin(2 * np.pi * steps / 24) + 5.0 * np.sin(
        2 * np.pi * steps / 168
    )
    windows = (level + cycles + 0.01 * steps + rng.normal(0.0, 2.0, size=(count, context_length))).astype(np.float32)
    windows[rng.random(windows.shape) < 0.05] = np.nan  # scattered gaps
    windows[0, context_length // 3 : context_length // 3 + 10] = np.nan  # a run of missing steps
    if count > 1:
        windows[1, : context_length - min(context_length, 40)] = np.nan  # a short history
    return windows, "sample windows (seeded)"


def parity_report(
    upstream: UpstreamForecast, weights: Path, windows: np.ndarray, horizon: int, source: str
) -> dict[str, Any]:
    """Upstream's forecast against ONNX Runtime through this package's worker on the same windows."""
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    phase(f"parity on {windows.shape[0]} windows (horizon {horizon}): ONNX Runtime against the upstream pipeline")
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=weights, providers=[CpuProvider()]))
    try:
        levels = worker.metadata.native_quantiles
        ours = worker.forecast(windows, horizon, levels).astype(np.float64)
    finally:
        worker.close()
    theirs = np.asarray(upstream(windows, horizon), dtype=np.float64)
    return {
        "windows": int(windows.shape[0]),
        "source": source,
        "context_length": int(windows.shape[1]),
        "missing_values": int(np.isnan(windows).sum()),
        "horizon": horizon,
        "calls": -(-horizon // worker.metadata.horizon_length),
        **parity_statistics(ours, theirs, "upstream"),
    }


def finish(request: ExportRequest, metadata_path: Path, parity: dict[str, Any]) -> ExportResult:
    """Write the parity report beside the graph and describe what was written; a parity that fails (beyond
    :data:`PARITY_TOLERANCE`, or not finite) removes the checkpoint, keeps the report and raises."""
    passed = bool(np.isfinite(parity["max_abs_diff"]) and parity["max_rel_diff"] <= PARITY_TOLERANCE)
    parity = {**parity, "tolerance": PARITY_TOLERANCE, "passed": passed}
    parity_path = request.output.with_suffix(".parity.json")
    document = {
        key: None if isinstance(value, float) and not np.isfinite(value) else value for key, value in parity.items()
    }
    storage.write_bytes(
        Location(parity_path), (json.dumps(document, indent=2) + "\n").encode("utf-8")
    )  # strict JSON: no NaN
    if not passed:
        for written in (request.output, Path(f"{request.output}.data"), metadata_path):
            written.unlink(missing_ok=True)
        raise ParityError(
            f"export of {request.output.name} failed its parity: ONNX Runtime differs from the upstream pipeline "
            f"by max_abs_diff {parity['max_abs_diff']} (max_rel_diff {parity['max_rel_diff']}, tolerance "
            f"{PARITY_TOLERANCE}); the checkpoint was removed, the report is {parity_path}. Check the pretrained "
            "folder's weights (non-finite values?).",
            key="from_pretrained",
        )
    logger.info("Exported %s: parity max abs diff %.3g", request.output, parity["max_abs_diff"])
    return ExportResult(
        weights_path=request.output, metadata_path=metadata_path, parity_path=parity_path, parity=parity
    )
