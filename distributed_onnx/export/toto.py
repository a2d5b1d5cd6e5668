"""``distributed-onnx export toto``: a Toto folder -> an ONNX graph emitting one patch's Student-t mixture.

The pretrained folder is the model hub's (``config.json`` + ``model.safetensors``), loaded with the package's own
``Toto.load_from_checkpoint`` (CPU; without xFormers, upstream itself switches to PyTorch's attention and the
unfused SwiGLU). The graph is the first decoding step of ``TotoForecaster.forecast``: ``context`` f32 ``[rows,
context_length]`` (NaN = missing) -> the ``TotoBackbone`` on the whole context (no KV cache: one call) -> for the
next ``patch_size`` steps the mixture upstream samples from (``create_affine_transformed``: the model's
``MixtureOfStudentTsOutput`` with its causal scaler's loc and scale applied), as ``[rows, steps, components,
4]`` (weight, df, loc, scale). The adapter (``distributed_onnx/model/adapters/toto.py``) computes its quantiles.

What the graph does around the model, as upstream's inputs: a missing value is 0.0 in the series with
``padding_mask`` False (``MaskedTimeseries``: True = a value), the ``id_mask`` is zeros (one series, as
``TotoPredictor`` sends), one variate. Timestamps are not inputs of the model (``TotoBackbone.forward`` takes
none). The context is ``CONTEXT_PATCHES`` patches (4096 steps at the published patch of 64, the length of the
package's README example); a shorter history comes left-padded with NaN.

**Short histories equal upstream's.** ``TotoForecaster.forecast`` given a history of L steps pads it on the left to
whole patches only (``pad_array``: ``ceil(L / patch)`` patches, the padding masked), and its time-wise attention
has no padding mask: whatever patches precede the history are attended. The graph's context is always
``CONTEXT_PATCHES`` patches, so the patches before a short history's first would be attended too, and the
forecasts differed from upstream's on the history itself (measured: docs/export.md, Toto, Short histories).
So the graph's time-wise attention (:func:`_exportable`) takes a mask: a patch with no observed value
before any patch with one (the padding before a history's start) is no key for any other token (a query there
attends only itself, whose output reaches nothing), which is the causal attention over the patches upstream
computes: rotary positions are relative, and the causal scaler counts only observed values, so every later
token's inputs, scores and values are upstream's. A history is the window from its first observed value (the
patch holding it is aligned as ``pad_array`` aligns it: both are whole patches back from the forecast origin);
missing values after it stay masked steps as upstream masks them. A window of full context computes the plain
causal attention (the mask is then exactly causal).

The parity report compares, on the same windows, the adapter's quantiles with those of the distribution object
upstream's own ``TotoForecaster.forecast`` builds at its first step (captured where it is made) on each window's
history (from its first observed value), inverted through that object's own ``cdf`` (gluonts' Student-t, scipy)
by bisection: not sample quantiles, which are random (``num_samples`` draws), but what they converge to.

Export-only changes (:func:`_exportable`): ``PatchEmbedding.forward`` without its data-dependent assertion that
no patch spans two datasets (the ``id_mask`` is all zeros: one dataset); the time-wise attention given the mask
above instead of ``is_causal``. The values computed are upstream's on the window's history.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Sequence
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

OUTPUT_NAME = "student_t_mixture"
#: The context the graph takes, in patches: 64 x the published patch of 64 = 4096 steps (the README's example).
CONTEXT_PATCHES = 64
#: The native levels the adapter computes the mixture's quantiles at (any level in (0, 1) could be: it is exact).
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
#: Bisection steps of the parity's reference quantiles (float64: the bracket shrinks below rounding well before).
REFERENCE_STEPS = 64
#: How toto-ts is installed (the Makefile's ``.installed`` rule): its own pins (torch==2.7.0, numpy==1.26.4,
#: transformers==4.52.1, jupyter, ...) conflict with this package's, so it comes without its dependencies, plus
#: only what its model and forecaster import (gluonts' torch distributions import lightning and toolz).
INSTALL = (
    "pip install -e '.[cpu,export,toto]' && pip install --no-deps toto-ts==0.2.0 gluonts==0.16.2 "
    "jaxtyping==0.2.29 rotary-embedding-torch==0.8.6"
)
#: While the graph is traced: ``[rows, 1, patches, patches]`` bool, where a time-wise query may attend a key (see
#: the module docstring). Set by the traced call, read by the patched attention; unset outside the export.
_TIME_MASK: contextvars.ContextVar[Any] = contextvars.ContextVar("toto_time_mask", default=None)


def missing_toto(cause: ImportError) -> MissingExtraError:
    """toto-ts, or a module its model or forecaster imports, failed to import with ``cause``: how to install it."""
    return MissingExtraError(
        f"toto-ts is not importable ({cause}); its pins conflict with this package's, so it has no extra: "
        f"install it with: {INSTALL} (docs/export.md, Installing an exporter)",
        package="toto-ts",
    )


def load_model(folder: Path) -> Any:
    """``Toto`` from the local folder's ``config.json`` + ``model.safetensors``, CPU, in eval mode."""
    try:
        from toto.model.toto import Toto
    except ImportError as exc:
        raise missing_toto(exc) from exc
    if not (folder / "model.safetensors").is_file() or not (folder / "config.json").is_file():
        raise ConfigError(
            f"--from-pretrained {folder} holds no config.json and model.safetensors: give the folder of Toto as "
            "downloaded from the model hub (Datadog/Toto-Open-Base-1.0).",
            key="from_pretrained",
        )
    return Toto.load_from_checkpoint(str(folder), map_location="cpu").eval()


def metadata_for(model: Any, folder: Path, resolution_minutes: int) -> CheckpointMetadata:
    backbone = model.model
    patch = int(backbone.patch_embed.patch_size)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return CheckpointMetadata(
        model_family="toto",
        input_names=["context"],
        output_name=OUTPUT_NAME,
        native_quantiles=LEVELS,
        context_length=CONTEXT_PATCHES * patch,
        output_patch_size=patch,
        horizon_patches=1,
        resolution_minutes=resolution_minutes,
        output_distribution="student_t_mixture",
        **rules_of("toto").metadata_fields(),  # the family's rules, declared once (model/families.py)
        description=(
            f"Toto exported by distributed-onnx ({config.get('num_layers')} layers of {config.get('embed_dim')}, "
            f"patches of {patch}, {config.get('output_distribution_kwargs', {}).get('k_components')} Student-t "
            "components; Datadog's Toto, Apache-2.0)"
        ),
    )


def export(request: ExportRequest) -> ExportResult:
    resolution = resolution_of(request)  # --data checked before the model loads
    with pretrained_folder(request, "Toto"):
        model = load_model(request.folder)
        metadata = metadata_for(model, request.folder, resolution)
    steps = metadata.horizon_length
    if request.horizon is not None and request.horizon > steps:
        raise ConfigError(
            f"--horizon {request.horizon}: Toto's graph forecasts one patch ({steps} steps) per call, and upstream "
            "reaches longer horizons only by sampling paths (TotoForecaster feeds sampled values back), whose "
            f"quantiles are random and no graph reproduces: give --horizon {steps} or less.",
            key="horizon",
        )
    torch = require_torch()

    def one_call(model: Any, context: Any) -> Any:
        """``context -> [rows, steps, components, 4]``: the next patch's mixture, upstream's loc and scale applied."""
        observed = ~torch.isnan(context)
        series = torch.where(observed, context, torch.zeros_like(context))[:, None, :]
        id_mask = torch.zeros_like(series, dtype=torch.int)
        token = _TIME_MASK.set(history_attention(observed, int(model.model.patch_embed.stride)))
        try:
            base, loc, scale = last_patch_forward(model.model, series, observed[:, None, :], id_mask)
        finally:
            _TIME_MASK.reset(token)
        components = base.component_distribution
        shift, factor = loc[:, 0, -steps:, None], scale[:, 0, -steps:, None]
        return torch.stack(
            [
                base.mixture_distribution.probs[:, 0, -steps:],
                components.df[:, 0, -steps:],
                shift + factor * components.loc[:, 0, -steps:],
                factor * components.scale[:, 0, -steps:],
            ],
            dim=-1,
        )

    upstream = _upstream_forecast(model, metadata.native_quantiles, resolution)
    one_call_request = request.model_copy(update={"horizon": request.horizon or steps})
    return export_context_model(one_call_request, metadata, context_module(model, one_call), _exportable(), upstream)


def last_patch_forward(backbone: Any, series: Any, padding_mask: Any, id_mask: Any) -> tuple[Any, Any, Any]:
    """``TotoBackbone.forward(series, padding_mask, id_mask, None, steps)``'s lines, its output head on the last
    patch's token only: ``(mixture over that patch's steps, loc, scale)``.

    Upstream unembeds every patch's token (``embed_dim`` -> ``patch x embed_dim``) and computes the mixture at
    every step of the context, and the forecast reads the last patch's: the unembedding and the mixture's
    projections act on each token and step alone, so the last token's are the same products on the same values,
    without the other tokens' (what that saves: ``benchmarks/results/roofline.md``).
    """
    torch = require_torch()
    from einops import rearrange

    scaled, loc, scale = backbone.scaler(
        series, weights=torch.ones_like(series), padding_mask=padding_mask, prefix_length=series.shape[-1]
    )
    embeddings, reduced_id_mask = backbone.patch_embed(scaled, id_mask)
    labels = backbone.build_variate_label_embeds(0, embeddings)
    tokens = embeddings.shape[2]
    transformed = backbone.transformer(embeddings, reduced_id_mask, None, variate_label_embeds=labels)
    last = transformed[:, :, transformed.shape[2] - tokens :][:, :, -1:]  # prepended label tokens dropped first
    flattened = rearrange(
        backbone.unembed(last),
        "batch variates seq_len (patch_size embed_dim) -> batch variates (seq_len patch_size) embed_dim",
        embed_dim=backbone.embed_dim,
    )
    return backbone.output_distribution(flattened), loc, scale


def history_attention(observed: Any, patch: int) -> Any:
    """``[rows, 1, patches, patches]`` bool from ``observed`` ``[rows, steps]``: query patch i may attend key patch j
    when j <= i and j is no earlier than the row's first patch holding an observed value (or j is i itself)."""
    torch = require_torch()
    rows, steps = observed.shape
    patches = steps // patch
    holds_value = observed.reshape(rows, patches, patch).any(dim=-1)
    in_history = torch.cumsum(holds_value.to(torch.int32), dim=-1) > 0  # [rows, patches]: from the first on
    causal = torch.ones(patches, patches, dtype=torch.bool).tril()
    itself = torch.eye(patches, dtype=torch.bool)
    return (causal & (in_history[:, None, :] | itself))[:, None]


def _upstream_forecast(model: Any, levels: Sequence[float], resolution_minutes: int) -> Any:
    def forecast(context: np.ndarray, horizon: int) -> np.ndarray:
        return np.concatenate(
            [upstream_quantiles(model, history(row)[None], horizon, levels, resolution_minutes) for row in context]
        )

    return forecast


def history(window: np.ndarray) -> np.ndarray:
    """A window's history: from its first observed value on (all of it when none is observed)."""
    observed = np.flatnonzero(~np.isnan(window))
    return window[observed[0] :] if observed.size else window


def upstream_quantiles(
    model: Any, context: np.ndarray, horizon: int, levels: Sequence[float], resolution_minutes: int
) -> np.ndarray:
    """``[W, horizon, len(levels)]``: the quantiles of the distribution ``TotoForecaster.forecast`` builds at its
    first step on ``context`` (NaN = missing: 0.0 with ``padding_mask`` False), inverted through its own ``cdf``."""
    torch = require_torch()
    try:  # the forecaster imports gluonts (pandas, toolz): a module the model alone does not need
        from toto.data.util.dataset import MaskedTimeseries
        from toto.inference.forecaster import TotoForecaster
    except ImportError as exc:
        raise missing_toto(exc) from exc

    made: list[Any] = []
    original = TotoForecaster.create_affine_transformed

    def capture(base: Any, loc: Any, scale: Any) -> Any:
        made.append(original(base, loc, scale))
        return made[-1]

    values = torch.from_numpy(np.ascontiguousarray(context, dtype=np.float32))
    observed = ~torch.isnan(values)
    rows, length = values.shape
    inputs = MaskedTimeseries(
        series=torch.where(observed, values, torch.zeros_like(values))[:, None, :],
        padding_mask=observed[:, None, :],
        id_mask=torch.zeros((rows, 1, length), dtype=torch.int),
        timestamp_seconds=(torch.arange(length, dtype=torch.int) * resolution_minutes * 60).expand(rows, 1, length),
        time_interval_seconds=torch.full((rows, 1), resolution_minutes * 60, dtype=torch.int),
    )
    # The staticmethod itself is restored (``patched`` would put back its bare function, which then takes ``self``).
    descriptor = TotoForecaster.__dict__["create_affine_transformed"]
    TotoForecaster.create_affine_transformed = staticmethod(capture)
    try:
        with torch.no_grad():
            forecaster = TotoForecaster(model.model)
            forecaster.forecast(inputs, prediction_length=horizon, num_samples=None, use_kv_cache=True)
    finally:
        TotoForecaster.create_affine_transformed = descriptor
    return distribution_quantiles(made[0], levels)[:, 0, -model.model.patch_embed.stride :][:, :horizon]


def distribution_quantiles(distribution: Any, levels: Sequence[float]) -> np.ndarray:
    """``[batch..., steps, len(levels)]``: each level's root of ``distribution.cdf`` (an affine Student-t mixture),
    by bisection in float64 between the components' own quantiles (``icdf``, then the affine map)."""
    torch = require_torch()
    mixture = distribution.base_dist
    q = torch.tensor(list(levels), dtype=torch.float64)[:, None, None, None]  # [Q, 1, 1, 1] against [W, V, T]
    own = mixture.component_distribution.icdf(q[..., None])  # [Q, W, V, T, K], float64 as q
    loc = distribution.loc.to(torch.float64)
    scale = distribution.scale.to(torch.float64)
    low = loc + scale * own.min(dim=-1).values
    high = loc + scale * own.max(dim=-1).values
    for _ in range(REFERENCE_STEPS):
        middle = (low + high) / 2
        below = distribution.cdf(middle) < q
        low, high = torch.where(below, middle, low), torch.where(below, high, middle)
    return ((low + high) / 2).permute(1, 2, 3, 0).numpy()


@contextlib.contextmanager
def _exportable() -> Iterator[None]:
    """``PatchEmbedding.forward`` without its data-dependent assertion (the graph's ``id_mask`` is all zeros)."""
    from toto.model.embedding import PatchEmbedding

    torch = require_torch()

    def forward(self: Any, x: Any, id_mask: Any) -> Any:  # upstream's lines, the assertions dropped
        patches = self._patchify(x)
        return self.projection(patches), self._patchify(id_mask).min(-1).values

    from toto.model.attention import AttentionAxis, BaseMultiheadAttention

    run_attention = BaseMultiheadAttention.run_attention

    def masked_time_attention(self: Any, attention_mask: Any, *rest: Any) -> Any:
        """Upstream's ``run_attention``, the time-wise axis given the traced call's mask (``_TIME_MASK``)."""
        time_mask = _TIME_MASK.get()
        if time_mask is not None and self.attention_axis == AttentionAxis.TIME:
            attention_mask = time_mask
        return run_attention(self, attention_mask, *rest)

    previous = torch.distributions.Distribution._validate_args
    # The distributions' argument checks (``if not valid.all(): raise``) are data-dependent branches the exporter
    # cannot trace; they check nothing the graph needs (positive scales and df come from softplus).
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        with (
            patched(PatchEmbedding, "forward", forward),
            patched(BaseMultiheadAttention, "run_attention", masked_time_attention),
        ):
            yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
