"""``distributed-onnx export chronos_bolt``: a Chronos-Bolt folder -> an ONNX checkpoint, NaN-marked context in.

The pretrained folder is what ``ChronosBoltPipeline.from_pretrained`` reads (``config.json`` with its
``chronos_config`` and ``model.safetensors``, as ``save_pretrained`` writes them or the hub holds them), loaded
with ``local_files_only``. The graph is the package's own ``ChronosBoltModelForForecasting.forward`` for one
call: ``context`` f32 ``[rows, context_length]`` (NaN = missing) -> ``quantile_preds`` ``[rows, quantiles,
prediction_length]``, normalized and de-normalized inside. Horizons beyond one call are the pipeline's
quantile paths, done by this package's worker (``long_horizon: quantile_paths``).

Export-only changes (:func:`_exportable`): ``InstanceNorm.forward`` without ``torch.nanmean`` (the same mean
and spread of the non-NaN values); attention through transformers' eager implementation (its SDPA path fails
the exporter's decomposition: a reshape of a transposed view); and the decoder's cross-attention re-associated
(:func:`_one_query_cross_attention`), for the multiply-add count: the decoder runs one query token, so instead of
projecting every encoder token ``E`` through each head's key and value weights (``L * d_model * d_kv`` per head),
the query goes through the key weights and the softmax-weighted sum of ``E`` through the value weights
(``d_kv * d_model + d_model * L`` per head): ``q_h (E Wk_h^T)^T = (q_h Wk_h) E^T`` and ``softmax(...) (E Wv_h^T) =
(softmax(...) E) Wv_h^T`` (the multiply-adds it saves per window at bolt-small's shapes:
``benchmarks/results/roofline.md``). The decoder's cache is off while exporting (Bolt decodes one step and drops
it). None changes a value beyond rounding; the parity report measures it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError, MissingExtraError
from distributed_onnx.export.context_model import export_context_model
from distributed_onnx.export.graph import context_module
from distributed_onnx.export.metadata import resolution_of
from distributed_onnx.export.pretrained import pretrained_folder
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.export.torch_patches import observed_mean, patched
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.families import rules_of

OUTPUT_NAME = "quantile_preds"


def load_pipeline(request: ExportRequest) -> Any:
    """The upstream pipeline from the local folder, on CPU in float32 (no hub access)."""
    try:
        from chronos import ChronosBoltPipeline
    except ImportError as exc:
        raise MissingExtraError.for_package("chronos", "chronos", exc) from exc
    if not (request.folder / "config.json").is_file():
        raise ConfigError(
            f"--from-pretrained {request.folder} has no config.json: give the folder "
            "ChronosBoltPipeline.save_pretrained wrote (or the model hub's files, downloaded).",
            key="from_pretrained",
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
        with patched(InstanceNorm, "forward", forward), _one_query_cross_attention(model):
            yield
    finally:
        model.set_attn_implementation(attention)


@contextlib.contextmanager
def _one_query_cross_attention(model: Any) -> Iterator[None]:
    """``T5Attention.forward`` re-associated for a cross-attention call with one query token (the module
    docstring says why); every other call, or one this does not cover, goes to upstream's forward unchanged.

    The decoder's cache is off for the block: with it, each cross-attention call projects the encoder tokens to
    fill it (Bolt decodes one step and never reads it back).
    """
    torch = require_torch()
    from transformers.models.t5.modeling_t5 import T5Attention

    original = T5Attention.forward

    def forward(
        self: Any,
        hidden_states: Any,
        mask: Any = None,
        key_value_states: Any = None,
        position_bias: Any = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> Any:
        covered = (
            key_value_states is not None
            and cache is None
            and not self.training  # no attention dropout
            and not self.has_relative_attention_bias
            and self.config._attn_implementation == "eager"
            and hidden_states.dim() == 3
            and hidden_states.shape[1] == 1  # one query token
            and set(kwargs) <= {"output_attentions"}
            and not kwargs.get("output_attentions")
        )
        if not covered:
            return original(
                self,
                hidden_states,
                mask=mask,
                key_value_states=key_value_states,
                position_bias=position_bias,
                cache=cache,
                **kwargs,
            )
        heads, d_kv = self.n_heads, self.key_value_proj_dim
        batch = hidden_states.shape[0]
        query = self.q(hidden_states).view(batch, 1, heads, d_kv).transpose(1, 2)  # [B, H, 1, d_kv]
        key_weight = self.k.weight.view(heads, d_kv, -1)  # [H, d_kv, d_model]: each head's rows of k.weight
        value_weight = self.v.weight.view(heads, d_kv, -1)
        encoded = key_value_states.unsqueeze(1)  # [B, 1, L, d_model]
        if position_bias is None:  # upstream's, for attention without relative bias: zeros [1, H, 1, L]
            position_bias = torch.zeros(
                (1, heads, 1, key_value_states.shape[1]), device=query.device, dtype=query.dtype
            )
        # eager_attention_forward's order: scores * scaling + position_bias + mask, softmax over the keys.
        scores = torch.matmul(torch.matmul(query, key_weight), encoded.transpose(2, 3)) * self.scaling
        scores = scores + position_bias
        if mask is not None:
            scores = scores + mask
        weights = torch.nn.functional.softmax(scores, dim=-1)  # [B, H, 1, L]
        heads_out = torch.matmul(torch.matmul(weights, encoded), value_weight.transpose(1, 2))  # [B, H, 1, d_kv]
        attn_output = self.o(heads_out.transpose(1, 2).reshape(batch, 1, heads * d_kv))
        return attn_output, position_bias, weights

    with patched(T5Attention, "forward", forward), patched(model.decoder.config, "use_cache", False):
        yield
