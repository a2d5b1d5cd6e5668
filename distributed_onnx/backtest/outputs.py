"""The backtest's output directory: forecast parts written atomically, a run manifest, resume bookkeeping.

``forecasts/part-NNNNNN.parquet`` holds batch NNNNNN of the plan; the plan is deterministic, so a rerun with the
same settings skips every part already on disk. ``run.json`` records the settings' fingerprint: a directory
is never resumed by a run with different settings (that would mix two backtests in one dataset).
The directory may be a local path or a URL (``s3://...``): every file goes through :mod:`distributed_onnx.storage`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.quantiles import quantile_column_name
from distributed_onnx.storage import Location

FORECASTS_DIR = "forecasts"
MANIFEST = "run.json"


def part_path(output: Location, batch_index: int) -> Location:
    return storage.join(output, FORECASTS_DIR, f"part-{batch_index:06d}.parquet")


def part_files(output: Location) -> list[Location]:
    """The finished forecast parts, in batch order."""
    return storage.list_files(storage.join(output, FORECASTS_DIR), "part-", ".parquet")


def done_batches(output: Location) -> set[int]:
    """Indices of the batches whose part file is complete on disk (partial files never get a final name)."""
    names = (str(part).rsplit("/", 1)[-1] for part in part_files(output))
    return {int(name.removeprefix("part-").removesuffix(".parquet")) for name in names}


def prepare_output(output: Location, fingerprint: str, manifest: dict[str, Any]) -> None:
    """Create the directory, or check that the existing one belongs to the same run."""
    storage.make_dirs(storage.join(output, FORECASTS_DIR))
    path = storage.join(output, MANIFEST)
    if storage.is_file(path):
        previous = json.loads(storage.read_bytes(path)).get("fingerprint")
        if previous != fingerprint:
            raise ConfigError(
                f"{output} holds a backtest with other settings (fingerprint {previous}, this run {fingerprint}); "
                "use another --output directory or delete that one.",
                key="output",
            )
        return
    storage.write_bytes(path, json.dumps({"fingerprint": fingerprint, **manifest}, indent=2, default=str).encode())


def forecast_table(batch: pa.RecordBatch, forecasts: np.ndarray, quantiles: Sequence[float], step_us: int) -> pa.Table:
    """One row per (window, lead) from a dispatched batch and its ``[W, H, Q]`` forecasts."""
    n_windows, horizon, _ = forecasts.shape
    if n_windows != batch.num_rows:
        raise ValueError(f"batch has {batch.num_rows} windows but {n_windows} forecasts came back")
    repeat = pa.array(np.repeat(np.arange(n_windows), horizon))
    origin = pc.take(batch.column("origin"), repeat)
    origin_us = origin.cast(pa.int64()).to_numpy()
    lead = np.tile(np.arange(1, horizon + 1, dtype=np.int32), n_windows)
    timestamp_type = batch.schema.field("origin").type
    target = batch.column("target").flatten().to_numpy(zero_copy_only=False)
    columns: dict[str, pa.Array] = {
        "series_id": pc.take(batch.column("series_id"), repeat),
        "window_id": pc.take(batch.column("window_id"), repeat),
        "origin": origin,
        "cutoff": pa.array(origin_us - step_us, timestamp_type),
        "timestamp": pa.array(origin_us + (lead.astype(np.int64) - 1) * step_us, timestamp_type),
        "lead": pa.array(lead),
        "y": pa.array(target, mask=np.isnan(target)),
    }
    flat = forecasts.reshape(n_windows * horizon, -1)
    for position, level in enumerate(quantiles):
        columns[quantile_column_name(level)] = pa.array(np.ascontiguousarray(flat[:, position]))
    return pa.table(columns)


def write_part(output: Location, batch_index: int, table: pa.Table) -> Location:
    """Write one part atomically: a temporary file renamed into place, or one object upload."""
    path = part_path(output, batch_index)
    # The driver writes every part, so this is on the hot path. Measured on reference forecasts (3,000
    # windows): dictionary-encoding the float columns (which never repeat) halved the write speed, so only
    # the id columns get dictionaries; lz4 wrote 68k windows/s against zstd's 37k, for files 30% larger.
    storage.write_parquet(path, table, compression="lz4", use_dictionary=["series_id", "window_id"])
    return path


def clean_partials(output: Location) -> None:
    """Remove temporary files a killed run left behind (they never got a final name; object stores have none)."""
    for path in storage.list_files(storage.join(output, FORECASTS_DIR), ".tmp-", ""):
        storage.delete(path)
