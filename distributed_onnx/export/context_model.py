"""The export of a family whose graph takes ``context``: its graph, its metadata and its parity, in that order.

Every family but Chronos-2 (whose graph takes covariates too) exports through :func:`export_context_model`: the
exporter gives its traced module, its export-only patches and its upstream forecast; this puts the shared steps
(:mod:`.graph`, :mod:`.metadata`, :mod:`.parity_check`) together.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from distributed_onnx.export.graph import export_context_graph
from distributed_onnx.export.metadata import described, write_metadata
from distributed_onnx.export.parity_check import UpstreamForecast, finish, parity_report, parity_windows
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES


def export_context_model(
    request: ExportRequest,
    metadata: CheckpointMetadata,
    module: Any,
    patches_context: contextlib.AbstractContextManager[Any],
    upstream: UpstreamForecast,
) -> ExportResult:
    """The export of a family whose graph takes ``context`` (and, where its metadata lists it,
    ``num_output_patches``): the graph (under the family's export-only ``patches_context``), its metadata, and the
    parity report over ``--horizon`` (default: two calls' horizon)."""
    metadata = described(request, metadata)
    windows, source = parity_windows(request, metadata.context_length, metadata.resolution_minutes)
    # At least two rows: traced on one, the exporter fixes the batch axis at 1 (a one-series --data gave TiRex a
    # graph that refused every batch of the backtest).
    sample = windows[:2] if windows.shape[0] >= 2 else np.repeat(windows[:1], 2, axis=0)
    # A graph taking the call's output patches (``num_output_patches``) is traced at its most.
    patches = metadata.horizon_patches if NUM_OUTPUT_PATCHES in metadata.input_names else None
    with patches_context:
        export_context_graph(module, sample, request.output, metadata.output_name, patches)
    metadata_path = write_metadata(request.output, metadata)
    horizon = request.horizon or 2 * metadata.horizon_length
    parity = parity_report(upstream, request.output, windows, horizon, source)
    return finish(request, metadata_path, parity)
