"""``distributed-onnx export chronos_bolt``: a Chronos-Bolt folder -> an ONNX checkpoint, NaN-marked context in.

The pretrained folder is what ``ChronosBoltPipeline.from_pretrained`` reads (``config.json`` with its
``chronos_config`` and ``model.safetensors``, as ``save_pretrained`` writes them or the hub holds them), loaded
with ``local_files_only``. The graph is the package's own ``ChronosBoltModelForForecasting.forward`` for one
call: ``context`` f32 ``[rows, context_length]`` (NaN = missing) -> ``quantile_preds`` ``[rows, quantiles,
prediction_length]``, normalized and de-normalized inside. Horizons beyond one call are the pipeline's
quantile paths, done by this package's worker (``long_horizon: quantile_paths``).

Export-only changes (:func:`_exportable`): ``InstanceNorm.forward`` without ``torch.nanmean`` (the same mean
and spread of the non-NaN values); attention through transformers' eager implementation (its SDPA path fails
the exporter's decomposition: a reshape of a transposed view). Neither changes a value beyond rounding; the
parity report measures it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError, MissingExtraError
from distributed_onnx.export.common import (
    context_module,
    export_context_model,
    observed_mean,
    patched,
    pretrained_folder,
    require_torch,
    resolution_of,
)
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.families import rules_of

OUTPUT_NAME = "quantile_preds"


def load_pipeline(request: ExportRequest) -> Any:
    """The upstream pipeline from the local folder, on CPU in float32 (no hub access)."""
    try:
        from chronos import ChronosBoltPipeline
    except ImportError as exc:
        raise MissingExtraError.for_package("chronos", "chronos") from exc
    if not (request.folder / "config.json").is_file():
        raise ConfigError(
            f"--from-pretrained {request.folder} has no config.json: give the folder "
            "ChronosBoltPipeline.save_pretrained wrote (or the model hub's files, downloaded).",
            key="pretrained_dir",
        )
    torch = require_torch()
    pipeline = ChronosBoltPipeline.from_pretrained(
        str(request.folder), local_files_only=True, device_map="cpu", dtype=torch.float32
    )
    pipeline.model.eval()
    return pipeline


def metadata_for(pipeline: Any, resolution_minutes: int) -> CheckpointMetadata:
    config = pipeline.model.chronos_config
    return CheckpointMetadata(
        model_family="chronos_bolt",
        input_names=["context"],
        output_name=OUTPUT_NAME,
        native_quantiles=list(config.quantiles),
        context_length=config.context_length,
        output_patch_size=config.prediction_length,
        horizon_patches=1,
        resolution_minutes=resolution_minutes,
        **rules_of("chronos_bolt").metadata_fields(),  # the family's rules, declared once (model/families.py)
        description=(
            f"Chronos-Bolt exported by distributed-onnx from {pipeline.model.config.name_or_path or 'a local folder'}"
            f" (d_model {pipeline.model.config.d_model}, {pipeline.model.config.num_layers} encoder layers)"
        ),
    )


def export(request: ExportRequest) -> ExportResult:
    resolution = resolution_of(request)  # --data checked before the model loads
    with pretrained_folder(request, "Chronos-Bolt"):
        pipeline = load_pipeline(request)
        metadata = metadata_for(pipeline, resolution)
    # ``context -> quantile_preds``: the model's forward without the loss and output wrapper.
    one_call = context_module(pipeline.model, lambda model, context: model(context=context).quantile_preds)
    return export_context_model(request, metadata, one_call, _exportable(pipeline.model), _upstream_forecast(pipeline))


def _upstream_forecast(pipeline: Any) -> Any:
    torch = require_torch()

    def forecast(context: np.ndarray, horizon: int) -> np.ndarray:
        with torch.no_grad():
            predicted = pipeline.predict(torch.from_numpy(context), prediction_length=horizon)  # [W, Q, H]
        return np.asarray(predicted.numpy()).transpose(0, 2, 1)

    return forecast


@contextlib.contextmanager
def _exportable(model: Any) -> Iterator[None]:
    """Upstream's model, exportable: ``InstanceNorm`` without ``nanmean``, eager attention; undone after."""
    torch = require_torch()
    from chronos.chronos_bolt import InstanceNorm

    def forward(self: Any, x: Any, loc_scale: Any = None) -> Any:
        original_dtype = x.dtype
        x = x.to(torch.float32)
        if loc_scale is None:  # upstream's lines, nanmean replaced
            loc = torch.nan_to_num(observed_mean(x), nan=0.0)
            scale = torch.nan_to_num(observed_mean((x - loc).square()).sqrt(), nan=1.0)
            scale = torch.where(scale == 0, self.eps, scale)
        else:
            loc, scale = loc_scale
        scaled = (x - loc) / scale
        if self.use_arcsinh:
            scaled = torch.arcsinh(scaled)
        return scaled.to(original_dtype), (loc, scale)

    attention = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with patched(InstanceNorm, "forward", forward):
            yield
    finally:
        model.set_attn_implementation(attention)
