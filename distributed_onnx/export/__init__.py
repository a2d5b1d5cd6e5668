"""``distributed-onnx export FAMILY``: build a checkpoint from a family's upstream package and a local folder.

Each family's exporter is one module of this package, named in :data:`EXPORTERS`, that builds the graph from
the upstream package's own classes and a pretrained folder as the user downloaded it (config and weights; no
hub access), writes the ``.onnx`` file (large weights as ONNX external data) with its metadata JSON beside it,
and a parity report: the upstream pipeline against ONNX Runtime on the same windows.

A tool layer: it imports torch and the upstream packages (each in its own optional extra), so only the CLI's
``export`` command imports it; the backtest and serving never do.
"""

from __future__ import annotations

from distributed_onnx.export.request import ExportRequest, ExportResult, run_export

#: Family name -> the module that exports it; each module defines ``export(request) -> ExportResult``.
EXPORTERS: dict[str, str] = {
    "chronos2": "distributed_onnx.export.chronos2",
    "chronos_bolt": "distributed_onnx.export.chronos_bolt",
    "tirex": "distributed_onnx.export.tirex",
    "timesfm": "distributed_onnx.export.timesfm",
}

#: Family name -> the model hub repository of its published weights, for the commands a user fetches them with
#: (this package never downloads; docs/export.md "Getting a model").
HUB_REPOSITORIES: dict[str, str] = {
    "chronos2": "amazon/chronos-2",
    "chronos_bolt": "amazon/chronos-bolt-small",
    "tirex": "NX-AI/TiRex",
    "timesfm": "google/timesfm-2.5-200m-pytorch",
}

__all__ = ["EXPORTERS", "HUB_REPOSITORIES", "ExportRequest", "ExportResult", "run_export"]
