"""``distributed-onnx export timesfm``: a TimesFM 2.5 folder -> one graph doing all of ``forecast`` for one window.

The pretrained folder holds ``model.safetensors`` as the model hub has it (``google/timesfm-2.5-200m-pytorch``).
``TimesFM_2p5_200M_torch_module`` takes no config (its architecture is the class attribute ``config``), so the
architecture is read from the weights' shapes (:func:`definition_from_weights`) and set as that class attribute
while the package's own ``TimesFM_2p5_200M_torch`` is built and loads the weights with its own
``load_checkpoint``: the published folder gives the published model, a smaller one (the tests') its own.

What ``forecast`` does is in the graph, so the checkpoint is a plain ``context`` in, quantiles out
(``missing_value: nan``, ``output_layout: step_quantile``): ``context`` f32 ``[rows, context_length]`` with NaN
and ``num_output_patches`` (a 0-d int64: the output patches the call asks) -> ``quantiles`` ``[rows,
num_output_patches x output patch, 9 levels]`` (upstream's point output, its mean head, is dropped):

1. ``forecast``'s host-side NaN handling (:func:`_prepared`): leading NaN stripped and padded back as masked
   zeros, inner and trailing NaN filled by ``np.interp``'s linear interpolation (in float64, as numpy does), a
   window without any value all zeros, unmasked (upstream's fallback).
2. ``compile``'s ``_compiled_decode`` (:class:`TimesFMForecast`), with the forecast flags of the folder's
   ``forecast_config.json`` (default: :data:`DEFAULT_FORECAST`, the flags the TimesFM README compiles with):
   ``infer_is_positive``, ``normalize_inputs``, the model's ``decode`` of ``x`` and, with
   ``force_flip_invariance``, of ``-x`` (one batch of both), the continuous quantile head, quantile crossing fixed.
3. ``decode``'s autoregressive loop for a horizon beyond one output patch, up to the export's horizon
   (``--horizon``, rounded up to whole output patches): each step in the graph runs only when the call asks for
   its patch (``short_horizon: output_patches``; :mod:`~distributed_onnx.export.timesfm_decode`), so a run of one
   patch costs one patch whatever the export's most. A longer horizon is refused (``long_horizon: refuse``): the
   decode appends the median of the normalized, un-flipped model output before the flip average and the
   de-normalization, which no worker-side unrolling of this graph's outputs sees.

Export-only changes: the decode is :func:`~distributed_onnx.export.timesfm_decode.decode` (upstream's lines, the
output heads on the one token each step reads, each step behind the call's patch count), and
``MultiHeadAttention.forward`` (:func:`_exportable`) appends its keys and values to the slots written before
instead of writing them in place at the tensor offset ``next_index[0]`` (data-dependent for the exporter) into a
cache sized for the whole horizon; every value is upstream's. The parity report measures it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError, MissingExtraError
from distributed_onnx.export.context_model import export_context_model
from distributed_onnx.export.metadata import resolution_of
from distributed_onnx.export.pretrained import pretrained_folder
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.export.timesfm_decode import decode
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.export.torch_patches import patched
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.families import rules_of
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES

OUTPUT_NAME = "quantiles"
WEIGHTS_FILE = "model.safetensors"
#: Our file beside the weights: ``ForecastConfig``'s fields as JSON (the hub's folder has none; then the default).
FORECAST_FILE = "forecast_config.json"
#: The ``ForecastConfig`` of the TimesFM README's example (``max_horizon`` is the export's horizon instead).
DEFAULT_FORECAST: dict[str, Any] = {
    "max_context": 1024,
    "normalize_inputs": True,
    "use_continuous_quantile_head": True,
    "force_flip_invariance": True,
    "infer_is_positive": True,
    "fix_quantile_crossing": True,
}
#: The flags the graph follows; the others (``return_backcast``, ``window_size``) are refused when set.
FLAGS = ("normalize_inputs", "use_continuous_quantile_head", "force_flip_invariance", "infer_is_positive")
#: Upstream's quantile levels: the definition cannot change them (the median's index, 5, is fixed in the code).
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def upstream_classes() -> Any:
    """``timesfm.timesfm_2p5.timesfm_2p5_torch``, or the install hint."""
    try:
        from timesfm.timesfm_2p5 import timesfm_2p5_torch
    except ImportError as exc:
        raise MissingExtraError.for_package("timesfm", "timesfm", exc) from exc
    return timesfm_2p5_torch


def weights_file(folder: Path) -> Path:
    """``DIR/model.safetensors`` (or the file itself)."""
    path = folder if folder.is_file() else folder / WEIGHTS_FILE
    if not path.is_file():
        raise ConfigError(
            f"--from-pretrained {folder} holds no {WEIGHTS_FILE}: give the folder of TimesFM 2.5's torch weights "
            "as downloaded from the model hub (google/timesfm-2.5-200m-pytorch).",
            key="from_pretrained",
        )
    return path


def definition_from_weights(shapes: dict[str, tuple[int, ...]]) -> Any:
    """``TimesFM_2p5_200M_Definition`` with the sizes the weights have (the published ones give the default)."""
    from timesfm import configs
    from timesfm.timesfm_2p5.timesfm_2p5_base import TimesFM_2p5_200M_Definition

    q = len(LEVELS) + 1  # the point output and the quantiles
    hidden, tokens_in = shapes["tokenizer.hidden_layer.weight"]
    model_dims = shapes["tokenizer.output_layer.weight"][0]
    layers = len({key.split(".")[1] for key in shapes if key.startswith("stacked_xf.")})
    head_dims = shapes["stacked_xf.0.attn.query_ln.scale"][0]
    point_out, point_hidden = shapes["output_projection_point.output_layer.weight"]
    spread_out, spread_hidden = shapes["output_projection_quantiles.output_layer.weight"]
    published = TimesFM_2p5_200M_Definition()
    transformer = dataclasses.replace(
        published.stacked_transformers.transformer,
        model_dims=model_dims,
        hidden_dims=shapes["stacked_xf.0.ff0.weight"][0],
        num_heads=model_dims // head_dims,
    )

    def block(base: Any, input_dims: int, hidden_dims: int, output_dims: int) -> Any:
        return dataclasses.replace(base, input_dims=input_dims, hidden_dims=hidden_dims, output_dims=output_dims)

    return TimesFM_2p5_200M_Definition(
        input_patch_len=tokens_in // 2,
        output_patch_len=point_out // q,
        output_quantile_len=spread_out // q,
        tokenizer=block(published.tokenizer, tokens_in, hidden, model_dims),
        stacked_transformers=configs.StackedTransformersConfig(num_layers=layers, transformer=transformer),
        output_projection_point=block(published.output_projection_point, model_dims, point_hidden, point_out),
        output_projection_quantiles=block(published.output_projection_quantiles, model_dims, spread_hidden, spread_out),
    )


def load_model(folder: Path) -> Any:
    """The package's ``TimesFM_2p5_200M_torch`` with the folder's weights, on CPU, not ``torch.compile``d."""
    upstream = upstream_classes()
    from safetensors import safe_open

    path = weights_file(folder)
    with safe_open(str(path), framework="pt") as weights:
        shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
    definition = definition_from_weights(shapes)
    with patched(upstream.TimesFM_2p5_200M_torch_module, "config", definition):
        model = upstream.TimesFM_2p5_200M_torch(torch_compile=False)
        model.model.config = definition  # the instance keeps it after the class attribute is restored
        model.model.device = require_torch().device("cpu")
        model.load_checkpoint(str(path), torch_compile=False)
    return model


def forecast_config(folder: Path, horizon: int | None, model: Any, *, users_folder: bool = True) -> Any:
    """The ``ForecastConfig`` the graph follows: the folder's ``forecast_config.json`` or the default, its
    ``max_horizon`` the export's ``--horizon`` (default: one output patch), both rounded as ``compile`` does.
    ``users_folder``: the folder is the user's ``--from-pretrained`` (a message may ask to edit its file), not the
    temporary one ``--random-weights`` builds and deletes."""
    from timesfm import ForecastConfig

    path = folder / FORECAST_FILE if folder.is_dir() else folder.with_name(FORECAST_FILE)
    settings = dict(DEFAULT_FORECAST)
    if path.is_file():
        settings.update(json.loads(path.read_text(encoding="utf-8")))
    patch, out = model.model.p, model.model.o
    settings["max_horizon"] = math.ceil((horizon or settings.get("max_horizon") or out) / out) * out
    settings["max_context"] = math.ceil(int(settings["max_context"]) / patch) * patch
    settings["per_core_batch_size"] = 1
    config = ForecastConfig(**settings)
    if config.return_backcast or config.window_size:
        raise ConfigError(
            f"{path}: return_backcast and window_size are not exported (the graph answers the forecast only); "
            "remove them",
            key="from_pretrained",
        )
    if config.use_continuous_quantile_head and config.max_horizon > model.model.os:
        head, largest = model.model.os, model.model.os // out * out
        asked = f"--horizon {horizon}" if horizon else f"the default horizon ({config.max_horizon} steps)"
        edit = f", or set use_continuous_quantile_head false in {path}" if users_folder else ""
        raise ConfigError(
            f"{asked} takes {config.max_horizon // out} output patch(es) of {out} steps ({config.max_horizon}), "
            f"longer than the continuous quantile head's {head} steps (upstream refuses it too): give --horizon "
            f"{largest} or less{edit}",
            key="horizon",
        )
    if config.max_context + config.max_horizon > model.model.config.context_limit:
        raise ConfigError(
            f"context {config.max_context} + horizon {config.max_horizon} exceed TimesFM's context limit "
            f"{model.model.config.context_limit}",
            key="horizon",
        )
    return config


def metadata_for(model: Any, config: Any, resolution_minutes: int) -> CheckpointMetadata:
    module = model.model
    flags = ", ".join(f"{flag} {getattr(config, flag)}" for flag in (*FLAGS, "fix_quantile_crossing"))
    return CheckpointMetadata(
        model_family="timesfm",
        input_names=["context", NUM_OUTPUT_PATCHES],
        output_name=OUTPUT_NAME,
        native_quantiles=list(LEVELS),
        context_length=config.max_context,
        output_patch_size=module.o,
        horizon_patches=config.max_horizon // module.o,
        resolution_minutes=resolution_minutes,
        **{
            **rules_of("timesfm").metadata_fields(),  # the family's rules, declared once (model/families.py)
            "short_horizon": "output_patches",  # the graph decodes the patches a call asks (timesfm_decode.py)
        },
        description=(
            f"TimesFM 2.5 exported by distributed-onnx ({module.x} layers of {module.md}, {module.h} heads, "
            f"patches {module.p} in / {module.o} out). In the graph: forecast's NaN handling (leading NaN masked, "
            f"inner NaN interpolated), up to {config.max_horizon // module.o} output patch(es) decoded, as many as a "
            "call asks; "
            f"ForecastConfig: {flags}"
        ),
    )


def export(request: ExportRequest) -> ExportResult:
    resolution = resolution_of(request)  # --data checked before the model loads
    with pretrained_folder(request, "TimesFM 2.5"):
        model = load_model(request.folder)
        config = forecast_config(request.folder, request.horizon, model, users_folder=request.random_size is None)
        metadata = metadata_for(model, config, resolution)
    module = forecast_module(model.model, config)
    request = request.model_copy(update={"horizon": request.horizon or metadata.horizon_length})
    return export_context_model(request, metadata, module, _exportable(), upstream_forecast(model, config))


def upstream_forecast(model: Any, config: Any) -> Any:
    """``(windows, horizon) -> [W, horizon, 9]``: upstream's ``compile`` + ``forecast`` on the windows."""
    model.compile(dataclasses.replace(config, per_core_batch_size=8))

    def forecast(context: np.ndarray, horizon: int) -> np.ndarray:
        _, quantiles = model.forecast(horizon=horizon, inputs=list(np.asarray(context, dtype=np.float32)))
        return np.asarray(quantiles)[..., 1:]

    return forecast


def _prepared(context: Any) -> tuple[Any, Any]:
    """``forecast``'s host side in torch: ``(values, masks)`` as it hands them to ``_compiled_decode``.

    ``strip_leading_nans`` + padding: the NaN before the first value become masked zeros. ``linear_interpolation``:
    every other NaN gets ``np.interp`` of the values around it (the last value after the last one), computed in
    float64 as numpy does; the previous and next observed positions come from a sort of the observed positions
    (no cumulative max in ONNX). A window without any value: zeros, unmasked (upstream's fallback).
    """
    torch = require_torch()
    width = context.shape[-1]
    observed = ~torch.isnan(context)
    index = torch.arange(width, device=context.device).expand_as(context)
    seen = torch.cumsum(observed.to(torch.int64), dim=-1)  # observed values up to and including each step
    total = seen[..., -1:]
    # The observed positions first, ascending; the rest clamped in range (only gathered for a window without any
    # value, whose result is replaced by zeros below: out of range, ONNX Runtime's Gather failed the whole batch).
    positions = torch.sort(torch.where(observed, index, index + width), dim=-1).values.clamp(max=width - 1)
    previous = torch.gather(positions, -1, (seen - 1).clamp(min=0))
    following = torch.gather(positions, -1, torch.minimum(seen, total - 1).clamp(min=0))
    values = torch.where(observed, context, torch.zeros_like(context)).to(torch.float64)
    before, after = torch.gather(values, -1, previous), torch.gather(values, -1, following)
    span = (following - previous).to(torch.float64)
    slope = (after - before) / torch.where(span == 0, torch.ones_like(span), span)
    filled = torch.where(span == 0, before, slope * (index - previous).to(torch.float64) + before)
    leading = (seen == 0) & (total > 0)
    filled = torch.where(observed, values, filled)
    filled = torch.where(leading | (total == 0), torch.zeros_like(filled), filled)
    return filled.to(torch.float32), leading


def forecast_module(model: Any, config: Any) -> Any:
    """The module the exporter traces: ``context [rows, max_context]`` (NaN) and ``num_output_patches`` (a 0-d
    int64, 1 to the export's patches) -> ``[rows, num_output_patches x o, 9]``."""
    torch = require_torch()
    from timesfm.torch.util import revin

    most = config.max_horizon // model.o

    class TimesFMForecast(torch.nn.Module):  # type: ignore[misc,name-defined]
        """``_compiled_decode``'s lines with ``config``'s flags, each in-place column write made a stack; the
        decode is :func:`~distributed_onnx.export.timesfm_decode.decode` (the patches asked, heads on the token
        read)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, context: Any, num_output_patches: Any) -> Any:
            wanted = num_output_patches.reshape(())
            inputs, masks = _prepared(context)
            batch = inputs.shape[0]
            is_positive = torch.all(inputs >= 0, dim=-1, keepdim=True) if config.infer_is_positive else None
            if config.normalize_inputs:
                mu = torch.mean(inputs, dim=-1, keepdim=True)
                sigma = torch.std(inputs, dim=-1, keepdim=True)
                inputs = revin(inputs, mu, sigma, reverse=False)
            q = self.model.q
            if config.force_flip_invariance:  # x and -x decoded in one batch, as two calls would
                both = decode(self.model, torch.cat([inputs, -inputs]), torch.cat([masks, masks]), wanted, most)
                (forecast, flipped), (spreads, flipped_spreads) = ((part[:batch], part[batch:]) for part in both)
                forecast = (forecast - _flip(flipped)) / 2
                spreads = (spreads - _flip(flipped_spreads)) / 2
            else:
                forecast, spreads = decode(self.model, inputs, masks, wanted, most)
            if config.use_continuous_quantile_head:
                median = forecast[:, : config.max_horizon, 5]
                spread = spreads[:, : config.max_horizon]
                columns = [forecast[:, :, 0]]
                for index in range(1, q):
                    columns.append(median if index == 5 else spread[..., index] - spread[..., 5] + median)
                forecast = torch.stack(columns, dim=-1)
            if config.fix_quantile_crossing:
                columns = list(forecast.unbind(dim=-1))
                for index in (4, 3, 2, 1):
                    columns[index] = torch.where(
                        columns[index] < columns[index + 1], columns[index], columns[index + 1]
                    )
                for index in (6, 7, 8, 9):
                    columns[index] = torch.where(
                        columns[index] > columns[index - 1], columns[index], columns[index - 1]
                    )
                forecast = torch.stack(columns, dim=-1)
            if config.normalize_inputs:
                forecast = revin(forecast, mu, sigma, reverse=True)
            if is_positive is not None:
                forecast = torch.where(is_positive[..., None], torch.clamp(forecast, min=0.0), forecast)
            patches = wanted.item()  # the steps asked: the first patches, the rest never computed (zeros)
            torch._check(patches >= 1)
            torch._check(patches <= most)
            return forecast[:, : patches * self.model.o, 1:]

    return TimesFMForecast().eval()


def _flip(values: Any) -> Any:
    """``flip_quantile_fn``: the point output kept, the quantiles' order reversed (``-x``'s q0.1 is ``x``'s q0.9)."""
    torch = require_torch()
    return torch.cat([values[..., :1], torch.flip(values[..., 1:], dims=(-1,))], dim=-1)


@contextlib.contextmanager
def _exportable() -> Iterator[None]:
    """``MultiHeadAttention.forward`` appending to :class:`~distributed_onnx.export.timesfm_decode.LayerCache`'s keys
    and values (upstream writes them in place into a cache sized for the whole horizon, at a tensor offset the
    exporter cannot trace); undone after."""
    torch = require_torch()
    from timesfm.torch import transformer

    def forward(
        self: Any, inputs_q: Any, *, decode_cache: Any = None, patch_mask: Any = None
    ) -> tuple[Any, Any]:  # upstream's lines; the cache appended to, its counters Python integers
        b, n_patches, _ = inputs_q.shape
        if patch_mask is None:
            patch_mask = torch.zeros(b, n_patches, dtype=torch.bool, device=inputs_q.device)
        if self.fuse_qkv:
            query, key, value = torch.chunk(self.qkv_proj(inputs_q), 3, dim=-1)
        else:
            query, key, value = self.query(inputs_q), self.key(inputs_q), self.value(inputs_q)
        query = query.view(b, n_patches, self.num_heads, self.head_dim)
        key = key.view(b, n_patches, self.num_heads, self.head_dim)
        value = value.view(b, n_patches, self.num_heads, self.head_dim)
        num_masked = torch.sum(patch_mask.to(torch.int32), dim=-1)
        if decode_cache is not None and decode_cache.num_masked is not None:
            num_masked = num_masked + decode_cache.num_masked
        written = 0 if decode_cache is None else decode_cache.written
        next_index = torch.full_like(num_masked, written)
        if self.use_rotary_position_embeddings:
            position = (
                torch.arange(n_patches, device=inputs_q.device)[None, :] + next_index[:, None] - num_masked[:, None]
            )
            query = self.rotary_position_embedding(query, position)
            key = self.rotary_position_embedding(key, position)
        query = self.query_ln(query)
        key = self.key_ln(key)
        if self.use_per_dim_scale:
            query = self.per_dim_scale(query)
        if decode_cache is not None:
            if decode_cache.key is not None:  # the slots written before this call's patches
                key = torch.cat([decode_cache.key, key], dim=1)
                value = torch.cat([decode_cache.value, value], dim=1)
            decode_cache.key, decode_cache.value = key, value
            decode_cache.written = written + n_patches
            decode_cache.num_masked = num_masked
            mask = transformer.make_attn_mask(
                query_length=n_patches,
                num_all_masked_kv=num_masked,
                query_index_offset=next_index,
                kv_length=key.shape[1],
            )
        else:
            mask = transformer.make_attn_mask(query_length=n_patches, num_all_masked_kv=num_masked)
        x = self.attention_fn(query, key, value, mask=mask)
        return self.out(x.reshape(b, n_patches, self.in_features)), decode_cache

    with patched(transformer.MultiHeadAttention, "forward", forward):
        yield
