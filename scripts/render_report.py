"""Re-render a finished run's report.html with forecast fans picked from its parts (best, typical, worst MASE, latest).

A stand-in for the run's own fan picking, used to make ``docs/report.png``; it reads every forecast part,
which the run itself must not do at scale. Usage::

    python scripts/render_report.py runs/reference       # rewrites runs/reference/report.html
"""

from __future__ import annotations

import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.backtest import outputs, report
from distributed_onnx.naive import seasonal_scales
from distributed_onnx.quantiles import quantile_column_name
from distributed_onnx.table import load_series


def _versions() -> dict[str, str]:
    found = {name: metadata.version(name) for name in ("onnxruntime", "ray")}
    return found | {"distributed_onnx": metadata.version("distributed-onnx"), "python": platform.python_version()}


def fans_of(run: Path) -> list[report.FanWindow]:
    summary = json.loads((run / "summary.json").read_text())
    resolved, settings = summary["resolved"], summary["settings"]
    horizon, context, quantiles = resolved["horizon"], resolved["context_length"], resolved["quantiles"]
    forecasts = pa.concat_tables(storage.read_parquet(path) for path in outputs.part_files(run))
    step_us = int(np.diff(forecasts.column("timestamp").cast(pa.int64()).to_numpy()[:2])[0])
    table = load_series(settings["data"], step_us // 60_000_000, settings["covariates"])
    picked = []
    for series in table.series:
        rows = forecasts.filter(pc.equal(forecasts.column("series_id"), series.series_id))
        origins = rows.column("origin").cast(pa.int64()).to_numpy()[::horizon]
        actual = rows.column("y").to_numpy(zero_copy_only=False).astype(float).reshape(-1, horizon)
        median = rows.column("q0.5").to_numpy().reshape(-1, horizon)
        index = (origins - series.start_us) // series.step_us
        scale = seasonal_scales(series.values, index, resolved["seasonality"])
        mase = np.nanmean(np.abs(actual - median), axis=1) / scale
        order = np.argsort(mase)
        choices = {"best MASE": order[0], "typical (median MASE)": order[len(order) // 2], "worst MASE": order[-1]}
        choices["latest"] = len(origins) - 1
        for label, window in choices.items():
            start = index[window] - context
            history = np.full(context, np.nan)
            history[max(0, -start) :] = series.values[max(0, start) : index[window]]
            block = slice(window * horizon, (window + 1) * horizon)
            picked.append(
                report.FanWindow(
                    series_id=series.series_id,
                    label=label,
                    origin_us=int(origins[window]),
                    step_us=series.step_us,
                    history=history,
                    actual=actual[window],
                    quantiles={q: rows.column(quantile_column_name(q)).to_numpy()[block] for q in quantiles},
                    mase=float(mase[window]),
                )
            )
    return picked


def main(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    # What the run will record itself (summary["versions"]); filled here for runs that predate it.
    summary.setdefault("versions", _versions())
    metrics = storage.read_parquet(run / "metrics.parquet")
    path = report.write_report(run, summary, metrics, summary["resolved"]["quantiles"], fans_of(run))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
