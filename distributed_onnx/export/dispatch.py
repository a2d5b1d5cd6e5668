"""``run_export``: an :class:`~.request.ExportRequest` handed to its family's exporter module, then the variant.

Apart from the request type (:mod:`.request`), which every exporter imports: the dispatch imports the exporters'
shared code (:mod:`.progress`, :mod:`.scratch`, :mod:`.variants`, :mod:`.random_weights`), so the two in one
module made an import circle through each of them.
"""

from __future__ import annotations

import importlib
from typing import Any

from distributed_onnx.errors import ConfigError
from distributed_onnx.export.request import ExportRequest, ExportResult, exportable_family
from distributed_onnx.model.families import Family

__all__ = ["run_export"]


def run_export(request: ExportRequest) -> ExportResult:
    """Export ``request.family`` by ``export(request)`` of its family's exporter module (the family registry,
    :mod:`distributed_onnx.model.families`), then write its int8 variant when asked."""
    declared = exportable_family(request.family)
    assert declared.exporter is not None  # exportable_family refuses a family without one
    if request.from_pretrained is not None and not request.from_pretrained.exists():
        folder = request.from_pretrained
        raise ConfigError(
            f"--from-pretrained {folder} does not exist: it takes a local folder (nothing is downloaded). Fetch the "
            f"published model once with network access: hf download {declared.hub_repository or 'REPOSITORY'} "
            f"--local-dir {folder} (docs/export.md), or try the pipeline offline with --random-weights (meaningless "
            "forecasts).",
            key="from_pretrained",
        )
    from distributed_onnx.export.scratch import sigterm_interrupts

    with sigterm_interrupts():  # a killed export removes its temporary folders (scratch.sigterm_interrupts)
        return _exported(request, declared, declared.exporter)


def _exported(request: ExportRequest, declared: Family, exporter: str) -> ExportResult:
    """The export itself: the family's exporter module's ``export(request)``, on a built model for
    ``--random-weights``, then the int8 variant if asked for."""
    from distributed_onnx.export import variants
    from distributed_onnx.export.digests import remember_digests
    from distributed_onnx.export.metadata import resolution_of
    from distributed_onnx.export.progress import phase, start_progress
    from distributed_onnx.export.scratch import scratch_folder

    start_progress()
    module: Any = importlib.import_module(exporter)
    if request.random_size is None:
        result: ExportResult = module.export(request)
    else:
        from distributed_onnx.export.random_weights import write_random_pretrained

        resolution_of(request)  # refused before minutes of building a published model
        with scratch_folder("random") as scratch:
            phase(f"building {request.family} ({request.random_size}) with random weights")
            folder = scratch / f"{request.family}-{request.random_size}-random-weights"
            write_random_pretrained(declared, request.random_size, folder)
            result = module.export(request.model_copy(update={"from_pretrained": folder}))
    remember_digests(result.weights_path)
    if request.quantize is None:
        phase("done")
        return result
    phase("writing the int8 variant")
    path, comparison = variants.write_int8_variant(request)
    remember_digests(path)
    phase("done")
    return result.model_copy(update={"variant_path": path, "variant": comparison})
