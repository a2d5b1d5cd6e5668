"""One forecast-log file read back as windows: the arrays ``score`` places and joins (no scoring here).

A log file holds rows per (window, lead) (:mod:`distributed_onnx.live.log.layout`); scoring wants arrays over
windows with the forecasts as ``[W, H, Q]``. The rows of a window are its leads ``1..H`` in order (the writer
writes them so); a file where they are not is not a forecast log and is refused, naming it, rather than scored
as something else. Windows of one file are grouped by (model, horizon, quantile levels): requests may ask for
other horizons or levels, and only windows of one shape stack into one array. Each file is read with its own
columns (files differ in their levels) and its own record of the levels served clamped
(:func:`~distributed_onnx.live.log.layout.clamping_of`), which the windows carry to ``score``'s summary, and
its record of the checkpoint's context length (:func:`~distributed_onnx.live.log.layout.context_length_of`),
which sets the seasons of the windows' seasonal-quantile baseline.

A file that cannot be read as a log file (0 bytes, not Parquet, a column missing or of another type) is a
:class:`~distributed_onnx.errors.DataError` naming it, which ``score`` reports and leaves out of that run (the
file is looked at again on the next run). Ids are taken once per window, not per row, and a series id longer
than :data:`~distributed_onnx.bounds.MAX_SERIES_ID_BYTES` (only in logs written before the routes
bounded them) is replaced by a digest of it, which no actual's series matches: fixed-width arrays of ids cost
windows x longest id x 4 bytes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.bounds import MAX_RESOLUTION_MINUTES, MAX_SERIES_ID_BYTES, id_bytes
from distributed_onnx.errors import DataError, StorageError
from distributed_onnx.live.log.layout import clamping_of, context_length_of
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import ClampedLevel

_QUANTILE_COLUMN = re.compile(r"^q(\d*\.?\d+(?:e-?\d+)?)$")


@dataclass
class LogWindows:
    """Windows of one log file that share a model, a horizon and quantile levels (arrays over windows)."""

    model: str
    horizon: int
    quantiles: tuple[float, ...]
    series_ids: npt.NDArray[np.str_]
    window_ids: npt.NDArray[np.str_]
    origin_us: npt.NDArray[np.int64]
    has_origin: npt.NDArray[np.bool_]
    resolution_minutes: npt.NDArray[np.int64]
    forecasts: npt.NDArray[np.float32]  # [W, H, Q]
    request_time_us: npt.NDArray[np.int64]
    #: Each window's checkpoint context length, as its file records it (0: not recorded, an older log).
    context_length: npt.NDArray[np.int64]
    #: The levels the file records as served clamped (the nearest native level's values under their own name).
    clamped: tuple[ClampedLevel, ...] = ()

    def subset(self, keep: npt.NDArray[np.bool_]) -> LogWindows:
        """The windows where ``keep`` is true (same model, horizon and levels)."""
        return LogWindows(
            self.model,
            self.horizon,
            self.quantiles,
            self.series_ids[keep],
            self.window_ids[keep],
            self.origin_us[keep],
            self.has_origin[keep],
            self.resolution_minutes[keep],
            self.forecasts[keep],
            self.request_time_us[keep],
            self.context_length[keep],
            self.clamped,
        )


def read_log_windows(path: Location) -> list[LogWindows]:
    """One log file as windows, grouped by (model, horizon, levels); rows of a window are its leads 1..H.

    A file that is not a readable log file is a :class:`DataError` naming it (the module docstring).
    """
    try:
        return _read(path)
    except (DataError, StorageError):
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError, ValueError, TypeError) as exc:
        raise DataError(
            f"{path}: not a readable forecast log file ({type(exc).__name__}: {exc}); move it out of the log, "
            "or restore it, and rerun",
            path=str(path),
        ) from exc


def _read(path: Location) -> list[LogWindows]:
    table = storage.read_parquet(path)
    if table.num_rows == 0:
        return []
    clamped = clamping_of(table.schema.metadata)
    context_length = context_length_of(table.schema.metadata) or 0
    levels = sorted(
        (float(match.group(1)), name) for name in table.column_names if (match := _QUANTILE_COLUMN.match(name))
    )
    lead = table.column("lead").to_numpy()
    starts = np.flatnonzero(lead == 1)
    ends = np.append(starts[1:], lead.size)
    if starts.size == 0 or starts[0] != 0 or not np.array_equal(lead, _expected_leads(starts, ends)):
        raise DataError(f"{path}: rows are not whole windows of leads 1..H in order; is it a forecast log file?")
    horizons = ends - starts
    models = table.column("model").to_numpy(zero_copy_only=False)
    origin = table.column("origin")
    has_origin = ~np.asarray(origin.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    origin_us = origin.cast(pa.int64()).fill_null(0).to_numpy()
    request_time_us = table.column("request_time").cast(pa.int64()).fill_null(0).to_numpy()
    column = table.column("resolution_minutes")
    resolution = column.fill_null(0).to_numpy().astype(np.int64)
    bad = (resolution <= 0) | (resolution > MAX_RESOLUTION_MINUTES)
    if bad.any():  # scored as a step, a zero or negative resolution failed far from the file (exit 4)
        raise DataError(
            f"{path}: resolution_minutes {column[int(np.argmax(bad))].as_py()} is not a sampling interval "
            f"(1 to {MAX_RESOLUTION_MINUTES} minutes); is it a forecast log file? Move it out of the log, or "
            "restore it, and rerun",
            path=str(path),
        )
    series_ids = _bounded_ids(table.column("series_id"), starts)
    window_ids = _bounded_ids(table.column("window_id"), starts)
    values = np.stack([table.column(name).to_numpy().astype(np.float32) for _, name in levels], axis=-1)
    found: list[LogWindows] = []
    for model in np.unique(models[starts]):
        for horizon in np.unique(horizons):
            first = starts[(horizons == horizon) & (models[starts] == model)]
            if first.size == 0:
                continue
            rows = first[:, None] + np.arange(horizon)
            found.append(
                LogWindows(
                    model=str(model),
                    horizon=int(horizon),
                    quantiles=tuple(level for level, _ in levels),
                    series_ids=series_ids[np.searchsorted(starts, first)],
                    window_ids=window_ids[np.searchsorted(starts, first)],
                    origin_us=origin_us[first],
                    has_origin=has_origin[first],
                    resolution_minutes=resolution[first],
                    forecasts=values[rows],
                    request_time_us=request_time_us[first],
                    context_length=np.full(first.size, context_length, dtype=np.int64),
                    clamped=clamped,
                )
            )
    return found


def _bounded_ids(column: pa.ChunkedArray, starts: npt.NDArray[np.intp]) -> npt.NDArray[np.str_]:
    """The ids of each window's first row (``starts``), over-long ones replaced by a digest (module docstring)."""
    ids = column.take(pa.array(starts))
    long = np.asarray(pc.greater(pc.binary_length(ids), MAX_SERIES_ID_BYTES).fill_null(False).to_numpy(), dtype=bool)
    values = ids.to_pylist()
    for index in np.flatnonzero(long):
        digest = hashlib.blake2b(str(values[index]).encode(), digest_size=16).hexdigest()
        values[index] = f"<id of {id_bytes(values[index])} bytes, blake2b {digest}>"
    return np.asarray(["" if value is None else value for value in values], dtype=np.str_)


def _expected_leads(starts: npt.NDArray[np.intp], ends: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    return np.concatenate([np.arange(1, end - start + 1) for start, end in zip(starts, ends, strict=True)])
