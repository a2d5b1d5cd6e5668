"""Small random-weight Chronos-Bolt and TiRex models built from their upstream packages' own classes.

No download: each is built from a config alone, seeded, and written as its package writes a pretrained folder
(``save_pretrained``'s ``config.json`` + ``model.safetensors``; TiRex's Lightning ``model.ckpt``). Also a
dataset with gaps whose windows the tests forecast both through the backtest and through the upstream pipeline.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.export.random_weights import CHRONOS_BOLT, TIREX

LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
RESOLUTION_MINUTES = 30
STEP_US = RESOLUTION_MINUTES * 60 * 1_000_000
START_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
#: Tiny configs (distributed_onnx.export.random_weights): one call is BOLT_STEPS / TIREX_STEPS steps.
BOLT_CONTEXT, BOLT_STEPS = 64, 16
TIREX_CONTEXT, TIREX_STEPS = 32, 8
assert CHRONOS_BOLT["tiny"]["chronos_config"]["context_length"] == BOLT_CONTEXT
assert CHRONOS_BOLT["tiny"]["chronos_config"]["prediction_length"] == BOLT_STEPS
assert TIREX["tiny"]["hyper_parameters"]["train_ctx_len"] == TIREX_CONTEXT
assert TIREX["tiny"]["hyper_parameters"]["model_config"]["output_patch_size"] == TIREX_STEPS


def write_tiny_bolt(directory: Path, seed: int = 0) -> Path:
    """``ChronosBoltModelForForecasting`` (T5 encoder-decoder, 1 + 1 layers of 32) saved as a pretrained folder:
    ``export --random-weights --size tiny``'s model (one definition, in the package)."""
    from distributed_onnx.export.random_weights import write_chronos_bolt

    return write_chronos_bolt(directory, "tiny", seed)


def write_tiny_tirex(directory: Path, seed: int = 0) -> Path:
    """``TiRexZero`` (one sLSTM block of 16, patches of 8) saved as the hub's ``model.ckpt``: ``export
    --random-weights --size tiny``'s model."""
    from distributed_onnx.export.random_weights import write_tirex

    return write_tirex(directory, "tiny", seed)


def gappy_series(seed: int = 0) -> dict[str, np.ndarray]:
    """Three series on a 30-minute grid: cycles at different levels, scattered NaN, a run of NaN, one short."""
    rng = np.random.default_rng(seed)
    result = {}
    for offset, (name, length) in enumerate({"a": 140, "b": 120, "c": 70}.items()):
        steps = np.arange(length)
        values = 50.0 * (offset + 1) + 8.0 * np.sin(2 * np.pi * steps / 24) + rng.normal(0.0, 1.0, length)
        values[rng.choice(length, size=length // 8, replace=False)] = np.nan
        if name == "a":
            values[90:97] = np.nan
        values[[0, -1]] = rng.normal(50.0 * (offset + 1), 1.0, 2)
        result[name] = values
    return result


def write_gappy_dataset(path: Path, series: dict[str, np.ndarray]) -> Path:
    """The long table of ``series`` (NaN as null ``y``)."""
    ids, stamps, ys = [], [], []
    for name, values in series.items():
        ids += [name] * values.size
        stamps.append(START_US + np.arange(values.size) * STEP_US)
        ys.append(values)
    y = np.concatenate(ys)
    table = pa.table(
        {
            "series_id": pa.array(ids, pa.string()),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(y, mask=np.isnan(y)),
        }
    )
    pq.write_table(table, path)
    return path


def window_contexts(series: dict[str, np.ndarray], forecasts: pa.Table, context_length: int) -> dict[str, Any]:
    """Per backtest window (one row per window of ``forecasts``, lead 1): its context as the data holds it."""
    first = forecasts.filter(pa.compute.equal(forecasts["lead"], 1)).to_pylist()
    contexts, ids = [], []
    for row in first:
        origin = (int(row["origin"].timestamp() * 1_000_000) - START_US) // STEP_US
        values = series[row["series_id"]]
        context = np.full(context_length, np.nan, dtype=np.float32)
        start = origin - context_length
        kept = values[max(start, 0) : origin]
        context[context_length - kept.size :] = kept
        contexts.append(context)
        ids.append(row["window_id"])
    return {"window_ids": ids, "context": np.stack(contexts)}


def forecast_block(forecasts: pa.Table, window_ids: list[str], horizon: int, levels: list[float]) -> np.ndarray:
    """``[W, horizon, len(levels)]`` from a forecasts table, windows in ``window_ids`` order."""
    rows = {(row["window_id"], row["lead"]): row for row in forecasts.to_pylist()}
    leads = range(1, horizon + 1)
    names = [f"q{level}" for level in levels]
    return np.array([[[rows[(window, lead)][name] for name in names] for lead in leads] for window in window_ids])


#: The backtest flags the family tests share: three windows a series, one actor, small batches.
WINDOWS = ["--n-windows", "3", "--stride", "7", "--actors", "1", "--rows-per-batch", "4", "--no-progress"]


# The family tests' module fixtures, imported by each family's test module: its folder, the gappy series, their table.
@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="module")
def series() -> dict[str, np.ndarray]:
    return gappy_series()


@pytest.fixture(scope="module")
def data(root: Path, series: dict[str, np.ndarray]) -> Path:
    return write_gappy_dataset(root / "gappy.parquet", series)
