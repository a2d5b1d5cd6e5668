"""The backtest's output directory: forecast parts written atomically, a run manifest, resume bookkeeping.

``forecasts/part-NNNNNN.parquet`` holds batch NNNNNN of the plan; the plan is deterministic, so a rerun with the
same settings skips every part already on disk. ``run.json`` records the settings' fingerprint: a directory
is never resumed by a run with different settings (that would mix two backtests in one dataset).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_onnx.errors import ConfigError
from distributed_onnx.quantiles import quantile_column_name

FORECASTS_DIR = "forecasts"
MANIFEST = "run.json"


def part_path(output: Path, batch_index: int) -> Path:
    return output / FORECASTS_DIR / f"part-{batch_index:06d}.parquet"


def done_batches(output: Path) -> set[int]:
    """Indices of the batches whose part file is complete on disk (partial files never get a final name)."""
    directory = output / FORECASTS_DIR
    if not directory.is_dir():
        return set()
    return {int(path.stem.removeprefix("part-")) for path in directory.glob("part-*.parquet")}


def prepare_output(output: Path, fingerprint: str, manifest: dict[str, Any]) -> None:
    """Create the directory, or check that the existing one belongs to the same run."""
    output.mkdir(parents=True, exist_ok=True)
    (output / FORECASTS_DIR).mkdir(exist_ok=True)
    path = output / MANIFEST
    if path.is_file():
        previous = json.loads(path.read_text()).get("fingerprint")
        if previous != fingerprint:
            raise ConfigError(
                f"{output} holds a backtest with other settings (fingerprint {previous}, this run {fingerprint}); "
                "use another --output directory or delete that one.",
                key="output",
            )
        return
    write_atomically(path, json.dumps({"fingerprint": fingerprint, **manifest}, indent=2, default=str).encode())


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


def write_part(output: Path, batch_index: int, table: pa.Table) -> Path:
    """Write one part atomically: a temporary file in the same directory, renamed into place."""
    path = part_path(output, batch_index)
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", suffix=".parquet", delete=False)
    handle.close()
    try:
        pq.write_table(table, handle.name, compression="zstd")
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return path


def write_parquet_atomically(path: Path, table: pa.Table) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)


def write_atomically(path: Path, payload: bytes) -> None:
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with handle:
            handle.write(payload)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def clean_partials(output: Path) -> None:
    """Remove temporary files a killed run left behind (they never got a final name)."""
    for path in (output / FORECASTS_DIR).glob(".tmp-*"):
        path.unlink(missing_ok=True)
