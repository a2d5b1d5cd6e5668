"""The exported checkpoint's metadata: its resolution, its description, and its file beside the graph.

What every exporter writes alike, whatever the family: the resolution from ``--resolution-minutes`` or ``--data``
(:func:`resolution_of`), a description that says when the weights are random (:func:`described`), and the
metadata JSON with the graph's sha256 (:func:`write_metadata`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.export.request import ExportRequest
from distributed_onnx.model.checkpoint import CheckpointMetadata, default_metadata_path, write_checkpoint

#: What a ``--random-weights`` checkpoint's description starts with and what ``export`` warns at its start and end.
MEANINGLESS = "random weights: forecasts are meaningless; for trying the pipeline and benchmarks"


def described(request: ExportRequest, metadata: CheckpointMetadata) -> CheckpointMetadata:
    """``metadata``, its description saying first that the weights are random when they are (``--random-weights``):
    whoever finds the checkpoint later (a report, ``inspect``) is told its forecasts mean nothing."""
    if request.random_size is None:
        return metadata
    note = f"{MEANINGLESS} ({request.random_size} architecture, seeded)"
    upstream = (metadata.description or "").replace(str(request.folder), "random weights")  # not a temp folder
    return metadata.model_copy(update={"description": f"{note}. {upstream}".strip()})


def resolution_of(request: ExportRequest) -> int:
    """The resolution to write: ``--resolution-minutes``, else the smallest step of ``--data``'s first series.

    Neither is refused (exit 2): an assumed 60 minutes once made a backtest of checkpoints exported without
    ``--data`` on half-hourly data fail afterwards ("checkpoints must share one resolution").
    """
    if request.resolution_minutes is not None:
        return request.resolution_minutes
    if request.data is None:
        raise ConfigError(
            "export needs the data's sampling interval for the checkpoint's metadata: give --resolution-minutes M "
            "(e.g. --resolution-minutes 60 for hourly data) or --data PATH to infer it from your table",
            key="resolution_minutes",
        )
    import pyarrow.compute as pc

    from distributed_onnx.evaluation.data.column_values import timestamps_us
    from distributed_onnx.evaluation.data.columns import check_columns
    from distributed_onnx.evaluation.data.table import read_table

    source = str(request.data)
    table = read_table(request.data)
    check_columns(table.column_names, (), source)  # the backtest's own checks and messages, naming the file
    ids = table["series_id"].drop_null()
    if len(ids) == 0:
        raise DataError(f"{source}: the data has no rows with a series_id.", path=source)
    stamps = np.sort(timestamps_us(table.filter(pc.equal(table["series_id"], ids[0]))["timestamp"], source))
    steps = np.diff(stamps)
    steps = steps[steps > 0]
    if not steps.size:
        raise DataError(
            f"{source}: cannot infer the sampling interval from --data (its first series has fewer than two "
            "timestamps); give --resolution-minutes M",
            path=source,
        )
    return max(1, int(steps.min()) // 60_000_000)


def write_metadata(output: Path, metadata: CheckpointMetadata) -> Path:
    """The metadata JSON beside ``output``, with the graph file's sha256 (its external data is not hashed)."""
    write_checkpoint(output, output.read_bytes(), metadata)
    return default_metadata_path(output)
