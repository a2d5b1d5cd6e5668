"""``distributed-onnx export FAMILY``: build a checkpoint from a family's upstream package and a local folder.

Each family's exporter is one module of this package, named by its record in the family registry
(:data:`distributed_onnx.model.families.BUILT_IN`, with the hub repository of its weights), that builds the graph from
the upstream package's own classes and a pretrained folder as the user downloaded it (config and weights; no
hub access), writes the ``.onnx`` file (large weights as ONNX external data) with its metadata JSON beside it,
and a parity report: the upstream pipeline against ONNX Runtime on the same windows. What is asked is
:mod:`.request` (imported by every exporter); :mod:`.dispatch` hands it to the family's exporter.

A tool layer: it imports torch and the upstream packages (each in its own optional extra), so only the CLI's
``export`` command imports it; the backtest and serving never do.
"""

from __future__ import annotations

from distributed_onnx.export.dispatch import run_export
from distributed_onnx.export.request import ExportRequest, ExportResult

__all__ = ["ExportRequest", "ExportResult", "run_export"]
