"""``distributed-onnx export moirai2``: a Moirai 2 pretrained folder -> ``context -> quantiles`` in ONNX.

The pretrained folder is what ``Moirai2Module.save_pretrained`` writes and the model hub holds
(``Salesforce/moirai-2.0-R-small``: ``config.json`` + ``model.safetensors``), loaded with ``uni2ts``'s own
``Moirai2Module.from_pretrained`` (a local folder: nothing is fetched). The graph is upstream's
``Moirai2Forecast`` (``target_dim`` 1, no covariates) around that module, as ``Moirai2Forecast.predict`` calls it:

- in: ``context`` f32 ``[rows, context_length]``, NaN = missing. ``predict`` marks a NaN unobserved and then
  imputes it; for a univariate series its ``CausalMeanImputation`` (on a ``[time, 1]`` array) sets every NaN
  to 0.0, so the graph does the same: ``observed = ~isnan``, the value 0.0 where not observed, no padding
  (``past_is_pad`` all false: a context always has ``context_length`` steps, NaN before a series' start).
- out: ``quantiles`` ``[rows, 9 quantiles, horizon]``: the module's quantile levels, as ``predict`` returns.
- longer horizons: the module predicts ``num_predict_token`` patches per call; ``Moirai2Forecast.forward``
  reaches a longer horizon by its own autoregressive rule (each quantile's forecast becomes a context path,
  the ``quantiles x quantiles`` answers are reduced to the levels by ``torch.quantile``, and the context grows:
  nothing slides out). The graph holds that loop for the horizon it is exported for (``--horizon``, default
  one call's ``num_predict_token x patch_size`` steps); a shorter horizon is its first steps (each step
  depends only on the steps before it), a longer one is refused (``long_horizon: refuse``): export again.
- the longest horizon: the sequence the module attends over is the context's patches and then the horizon's
  (the context grows, nothing slides out), and the module declares ``max_seq_len`` tokens its longest input
  sequence. A horizon whose patches do not fit beside the context is refused before anything is traced
  (:func:`graph_patches`), naming the longest that does: unrolled in the graph, such a horizon sat in tracing
  for minutes, its memory growing, before anything said it was beyond the model. The context takes at most
  half the sequence (:func:`context_length_of`), so the other half is always there for a horizon.

Export-only changes (:func:`_exportable`), each computing upstream's values from ops that export, checked by
the parity report against ``Moirai2Forecast.predict`` unpatched:

- ``Moirai2Forecast._convert`` builds its einops patterns from the batch shape (``"dim -> s0 (dim past)"``),
  which a dynamic batch axis cannot name: the same tensors for one target without covariates, in torch ops
  (its ``cummax`` over 0/1 values, which has no ONNX function, as a cumulative sum > 0).
- ``Moirai2Forecast.forward`` indexes its patches with tensors it iterates (data-dependent sizes for the
  exporter): the same steps with Python integers.
- Its attention calls ``scaled_dot_product_attention`` on ``[rows, group, heads, tokens, dim]`` (and a path
  axis more in the quantile rule); the exporter's function takes 4-D tensors only: the leading axes are
  flattened into one for the call and restored after (the same attention, row by row).
- ``RotaryProjection`` grows its cos/sin tables inside ``forward`` from ``time_id.max()``: the tables are sized
  once for the graph's tokens before the export, and growing is skipped.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError, MissingExtraError
from distributed_onnx.export.context_model import export_context_model
from distributed_onnx.export.graph import context_module
from distributed_onnx.export.metadata import resolution_of
from distributed_onnx.export.pretrained import pretrained_folder
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.export.torch_patches import patched
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.families import rules_of

OUTPUT_NAME = "quantiles"
CONFIG_FILE = "config.json"
#: The context ``Moirai2Forecast`` is given in uni2ts's own Moirai 2 example (README: ``context_length=1680``);
#: Moirai 2 takes any length, so the graph fixes one: this, or fewer when half the model's sequence
#: (``max_seq_len`` patches) holds fewer steps (the tiny test model).
CONTEXT_LENGTH = 1680


def missing_uni2ts(cause: ImportError) -> MissingExtraError:
    """uni2ts 2.0.0 pins torch<2.5 and numpy~=1.26 (gluonts 0.16.2 numpy<2.2): installed without their pins. The
    message says what failed to import (uni2ts itself, or a module it imports that the install lacks)."""
    return MissingExtraError(
        f"uni2ts cannot be imported ({cause}). Install it with: pip install -e '.[cpu,export,moirai2]' && pip "
        "install --no-deps uni2ts==2.0.0 gluonts==0.16.2 jaxtyping==0.2.29 (their own pins would replace torch, "
        "numpy and pandas; see docs/export.md, Installing an exporter)",
        package="uni2ts",
        extra="moirai2",
    )


def load_module(folder: Path) -> Any:
    """``Moirai2Module`` from a local pretrained folder, in eval mode."""
    try:
        from uni2ts.model.moirai2 import Moirai2Module
    except ImportError as exc:
        raise missing_uni2ts(exc) from exc
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(
            f"--from-pretrained {folder} holds no {CONFIG_FILE}: give the folder of a Moirai 2 model as "
            "Moirai2Module.save_pretrained writes it (config.json + model.safetensors, as on the model hub: "
            "Salesforce/moirai-2.0-R-small).",
            key="from_pretrained",
        )
    json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))  # not JSON: the folder's error, named
    return Moirai2Module.from_pretrained(str(folder)).eval()


def context_length_of(module: Any) -> int:
    """:data:`CONTEXT_LENGTH`, or half of ``max_seq_len`` patches when fewer (the rest is the horizon's)."""
    return int(min(CONTEXT_LENGTH, module.patch_size * (module.max_seq_len // 2)))


def graph_patches(request: ExportRequest, module: Any, context_length: int) -> int:
    """The patches the graph forecasts: ``ceil(--horizon / patch_size)``, default one call's patches; a horizon
    whose patches do not fit in ``max_seq_len`` beside the context's is refused (module docstring)."""
    patch = int(module.patch_size)
    if request.horizon is None:
        return int(module.num_predict_token)
    patches = -(-request.horizon // patch)
    context_tokens = -(-context_length // patch)
    room = int(module.max_seq_len) - context_tokens
    if patches > room:
        raise ConfigError(
            f"--horizon {request.horizon} needs {patches} patches of {patch} steps; this Moirai 2 attends over at "
            f"most max_seq_len {module.max_seq_len} tokens (its config's longest input sequence), {context_tokens} of "
            f"them the context's {context_length} steps, so it forecasts at most {room * patch} steps: export with "
            f"--horizon {room * patch} or less (each {int(module.num_predict_token) * patch} steps beyond the first "
            "are one more model call traced into the graph).",
            key="horizon",
        )
    return patches


def forecaster(module: Any, context_length: int, horizon: int) -> Any:
    """Upstream's ``Moirai2Forecast`` around ``module``: one target, no covariates."""
    from uni2ts.model.moirai2 import Moirai2Forecast

    return Moirai2Forecast(
        prediction_length=horizon,
        target_dim=1,
        feat_dynamic_real_dim=0,
        past_feat_dynamic_real_dim=0,
        context_length=context_length,
        module=module,
    ).eval()


def metadata_for(module: Any, context_length: int, patches: int, resolution_minutes: int) -> CheckpointMetadata:
    calls = 1 + max(0, -(-(patches - module.num_predict_token) // module.num_predict_token))
    return CheckpointMetadata(
        model_family="moirai2",
        input_names=["context"],
        output_name=OUTPUT_NAME,
        native_quantiles=[float(level) for level in module.quantile_levels],
        context_length=context_length,
        output_patch_size=int(module.patch_size),
        horizon_patches=patches,
        resolution_minutes=resolution_minutes,
        **rules_of("moirai2").metadata_fields(),  # the family's rules, declared once (model/families.py)
        description=(
            f"Moirai 2 exported by distributed-onnx ({module.num_layers} layers of {module.d_model}, patches of "
            f"{module.patch_size}, {module.num_predict_token} patches per model call); the graph holds "
            f"Moirai2Forecast's autoregressive quantile rule for {patches} patches "
            f"({calls} model call{'s' if calls > 1 else ''})"
        ),
    )


def export(request: ExportRequest) -> ExportResult:
    resolution = resolution_of(request)  # --data checked before the model loads
    with pretrained_folder(request, "Moirai 2"):
        module = load_module(request.folder)
        context_length = context_length_of(module)
        patches = graph_patches(request, module, context_length)
        metadata = metadata_for(module, context_length, patches, resolution)
    torch = require_torch()
    graph = forecaster(module, context_length, metadata.horizon_length)
    _size_rotary_tables(graph, -(-context_length // module.patch_size) + patches)

    def one_call(model: Any, context: Any) -> Any:
        """``context -> [rows, quantiles, horizon]``: ``predict``'s inputs (NaN -> 0.0, unobserved)."""
        observed = ~torch.isnan(context)
        target = torch.where(observed, context, torch.zeros_like(context))
        return model(
            past_target=target.unsqueeze(-1),
            past_observed_target=observed.unsqueeze(-1),
            past_is_pad=torch.zeros_like(observed),
        )

    # The parity at the graph's horizon: the shared default (two calls' horizon) is beyond what this graph answers.
    request = request.model_copy(update={"horizon": request.horizon or metadata.horizon_length})
    return export_context_model(
        request, metadata, context_module(graph, one_call), _exportable(), _upstream_forecast(module, context_length)
    )


def _upstream_forecast(module: Any, context_length: int) -> Any:
    def forecast(context: np.ndarray, horizon: int) -> np.ndarray:
        predicted = forecaster(module, context_length, horizon).predict([row.copy() for row in context])
        return np.asarray(predicted).transpose(0, 2, 1)  # [W, Q, H] -> [W, H, Q]

    return forecast


def _size_rotary_tables(graph: Any, tokens: int) -> None:
    """Each ``RotaryProjection``'s cos/sin for ``tokens`` positions (what ``forward`` would grow them to)."""
    from uni2ts.module.position.attn_projection import RotaryProjection

    for each in graph.modules():
        if isinstance(each, RotaryProjection):
            each._init_freq(max_len=tokens)


@contextlib.contextmanager
def _exportable() -> Iterator[None]:
    """``_convert`` and ``forward`` without batch-shaped patterns and tensor-valued indices; rotary tables fixed."""
    torch = require_torch()
    from uni2ts.model.moirai2 import Moirai2Forecast
    from uni2ts.module.position.attn_projection import RotaryProjection

    attention = torch.nn.functional.scaled_dot_product_attention

    def four_d(query: Any, key: Any, value: Any, attn_mask: Any = None, **settings: Any) -> Any:
        """``attention`` over 4-D tensors: every axis before (heads, tokens, dim) flattened into the batch."""
        if query.dim() == 4:
            return attention(query, key, value, attn_mask=attn_mask, **settings)
        lead = query.shape[:-3]
        flat = [each.expand(*lead, *each.shape[-3:]).flatten(0, len(lead) - 1) for each in (query, key, value)]
        if attn_mask is not None:
            attn_mask = attn_mask.expand(*lead, *attn_mask.shape[-3:]).flatten(0, len(lead) - 1)
        out = attention(*flat, attn_mask=attn_mask, **settings)
        return out.unflatten(0, tuple(lead))

    with (
        patched(Moirai2Forecast, "_convert", _convert),
        patched(Moirai2Forecast, "forward", _forward),
        patched(RotaryProjection, "_init_freq", lambda self, max_len: None),
        patched(torch.nn.functional, "scaled_dot_product_attention", four_d),
    ):
        yield


def _convert(self: Any, patch_size: int, past_target: Any, past_observed_target: Any, past_is_pad: Any) -> Any:
    """``Moirai2Forecast._convert`` for one target without covariates: the same six tensors, torch ops only."""
    torch = require_torch()
    functional = torch.nn.functional
    rows, steps = past_target.shape[0], int(self.hparams.prediction_length)
    future = -(-steps // patch_size)

    def left(x: Any, value: Any) -> Any:  # _patched_seq_pad(left=True), then "(seq patch)"
        return functional.pad(x, (-x.shape[-1] % patch_size, 0), value=value).reshape(rows, -1, patch_size)

    past_observed = left(past_observed_target[..., 0], False)
    # cummax of a 0/1 series (has a patch been observed yet?) as a cumulative sum > 0: no ONNX cummax.
    past_seq_id = (past_observed.amax(-1).long().cumsum(dim=-1) > 0).long().cumsum(dim=-1) - 1
    past_seq_id = torch.clamp(past_seq_id, min=0)
    future_seq_id = torch.arange(future).unsqueeze(0) + past_seq_id.max(dim=-1, keepdim=True).values + 1
    future_observed = functional.pad(torch.ones(rows, steps, dtype=torch.bool), (0, -steps % patch_size), value=False)
    past_sample = (left(past_is_pad.long(), 1) == 0).int().amax(-1)
    time_id = torch.cat([past_seq_id, future_seq_id], dim=1)
    return (
        torch.cat([left(past_target[..., 0], 0.0), past_target.new_zeros(rows, future, patch_size)], dim=1),
        torch.cat([past_observed, future_observed.reshape(rows, future, patch_size)], dim=1),
        torch.cat([past_sample, past_sample.new_ones(rows, future)], dim=1),
        time_id,
        torch.zeros_like(time_id),
        torch.cat([torch.zeros_like(past_observed[..., 0]), torch.ones(rows, future, dtype=torch.bool)], dim=1),
    )


def _forward(self: Any, past_target: Any, past_observed_target: Any, past_is_pad: Any) -> Any:
    """``Moirai2Forecast.forward`` for one target: the same calls of the module and the same quantile rule,
    the patch positions as Python integers. Returns ``[rows, quantiles, prediction_length]``."""
    torch = require_torch()
    module = self.module
    levels, patch, per_call = module.num_quantiles, module.patch_size, module.num_predict_token
    target, observed, sample_id, time_id, variate_id, prediction_mask = self._convert(
        patch, past_target, past_observed_target, past_is_pad
    )
    context_tokens = self.context_token_length(patch)
    wanted = self.prediction_token_length(patch)

    def answer(token: int, count: int, *inputs: Any) -> Any:
        """The ``count`` patches the module predicts from ``token``: ``[..., count, quantiles, patch]``."""
        preds = predicted_at(module, token, *inputs)
        return preds.unflatten(-1, (per_call, levels, patch))[..., :count, :, :]

    first = answer(
        context_tokens - 1, min(wanted, per_call), target, observed, sample_id, time_id, variate_id, prediction_mask
    )
    blocks = [first]  # each [rows, count, quantiles, patch]
    if wanted > per_call:
        paths = [each.unsqueeze(1).expand(-1, levels, *each.shape[1:]) for each in (observed, sample_id, time_id)]
        path_target = target.unsqueeze(1).repeat(1, levels, 1, 1)
        path_variate = variate_id.unsqueeze(1).expand(-1, levels, -1)
        path_mask = prediction_mask.unsqueeze(1).repeat(1, levels, 1)
        assign = context_tokens
        path_target[:, :, assign : assign + per_call, :] = first.transpose(1, 2)  # path q gets quantile q
        path_mask[:, :, assign : assign + per_call] = False
        quantile_levels = torch.tensor(module.quantile_levels, dtype=torch.float32)
        remaining = wanted - per_call
        while remaining > 0:
            token = assign + per_call - 1
            count = min(per_call, remaining)
            path_inputs = (path_target, paths[0], paths[1], paths[2], path_variate, path_mask)
            samples = answer(token, count, *path_inputs)  # [rows, paths, count, quantiles, patch]
            assign = token + 1
            samples = samples.transpose(1, 2).flatten(2, 3)  # [rows, count, paths x quantiles, patch]
            reduced = torch.quantile(samples, quantile_levels, dim=-2)  # [quantiles, rows, count, patch]
            blocks.append(reduced.permute(1, 2, 0, 3))
            path_target[:, :, assign : assign + count, :] = reduced.permute(1, 0, 2, 3)
            path_mask[:, :, assign : assign + count] = False
            remaining -= per_call
    forecast = torch.cat(blocks, dim=1)  # [rows, patches, quantiles, patch]
    return forecast.transpose(1, 2).flatten(2, 3)[..., : self.hparams.prediction_length]


def predicted_at(module: Any, token: int, *inputs: Any) -> Any:
    """``Moirai2Module.forward(*inputs, training_mode=False)[..., token, :]`` (``inputs``: ``target, observed,
    sample_id, time_id, variate_id, prediction_mask``): its lines on the tokens up to ``token``, the output head
    on ``token`` alone.

    The forecast reads one token's prediction per call, and the module computes every token's: those after it
    (the horizon's patches not yet predicted) are attended by no earlier token (the attention is causal in
    ``time_id``) and left out of the scaler's statistics (``prediction_mask``), and the head acts on each token
    alone. Leaving them out computes the same values with less work.
    """
    from uni2ts.common.torch_util import packed_causal_attention_mask

    torch = require_torch()
    through = token + 1
    target, observed = (each[..., :through, :] for each in inputs[:2])
    sample_id, time_id, variate_id, prediction_mask = (each[..., :through] for each in inputs[2:])
    loc, scale = module.scaler(target, observed * ~prediction_mask.unsqueeze(-1), sample_id, variate_id)
    scaled_target = (target - loc) / scale
    reprs = module.in_proj(torch.cat([scaled_target, observed.to(torch.float32)], dim=-1))
    reprs = module.encoder(reprs, packed_causal_attention_mask(sample_id, time_id), time_id=time_id, var_id=variate_id)
    return module.out_proj(reprs[..., -1, :]) * scale[..., -1, :] + loc[..., -1, :]
