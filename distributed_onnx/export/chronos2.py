"""``distributed-onnx export chronos2``: a Chronos-2 pretrained folder -> the upstream tensor contract in ONNX.

The graph is built from ``chronos-forecasting``'s own ``Chronos2Pipeline.from_pretrained(DIR)`` (a folder
``save_pretrained`` wrote, or the hub's files as a user downloaded them; nothing is fetched) and exported with
``torch.onnx.export(dynamo=True)`` in the contract of the upstream exporter (``scripts/onnx/``, an open pull
request upstream) that :mod:`distributed_onnx.model.adapters.chronos2` speaks: ``context``, ``group_ids``,
``attention_mask`` and ``future_covariates`` in, ``quantile_preds`` ``[rows, quantiles, horizon]`` out, the
batch (rows) axis dynamic, the weights as ONNX external data (``MODEL.onnx.data``).

Two of the model's methods cannot be exported as they are, so :func:`export_patches` swaps them for the
duration of the export only (the classes are restored on exit, whatever happens),

- ``Chronos2Model._prepare_patched_future`` raises when a future covariate is NaN where the mask says known.
  With no mask given (this contract) the mask *is* ``~isnan``, so the check cannot fire; but it is a
  data-dependent ``if``, which ``torch.export`` refuses. The replacement is the same method without it.
- ``Chronos2Encoder._construct_and_invert_group_time_mask`` builds the group mask with a bool ``einsum``,
  which exports to an invalid ONNX graph; the replacement computes the same 0/1 mask in float.

and one for speed: ``GroupSelfAttention.forward`` (attention along the batch axis, masked so a row attends
only to rows of its own group at unmasked time steps) becomes a branch in the graph (``torch.cond``, an ONNX
``If`` per block). When no query may attend another row (every row its own group: a univariate call, the
backtest's default) each unmasked query has one key, itself, its softmax weight is exactly 1 and the block's
group attention is ``h + o(v(LN(h)))``: the graph computes ``h + LN(h) (Wo Wv)^T`` with ``Wo Wv`` folded at
export (a buffer, removed on exit), skipping the q and k projections and the attention. Per token and block,
4 d_model^2 + 2 rows d_model multiply-adds become d_model^2 (what it saves at the published shapes, and the
parity before and after: ``benchmarks/results/roofline.md``, ``benchmarks/results/docstring_figures.md``).
Otherwise (covariates, ``--group-by``: shared group ids) it runs upstream's method unchanged. The predicate is
computed in the graph from the group-time mask itself: no query has an unmasked key in another row.

A token at a masked time step (a padding or all-NaN patch) has no unmasked key at all: upstream adds
``finfo.min`` to every score and gets a uniform average of the batch's values, the branch its own ``o(v(.))``,
so such tokens' hidden states differ. They never reach a forecast: time attention masks them as keys (their
weight is ``exp(finfo.min)`` = 0 beside any unmasked key, and the REG and output-patch tokens are always
unmasked), and in group attention every row is its own group, so no other query attends them.
Evidence: ``tests/test_chronos2_pipeline.py::test_univariate_gappy_windows_equal_upstream_predict``
(leading NaN, a NaN run, a short series, against ``Chronos2Pipeline.predict``) and the parity report;
``test_univariate_call_skips_the_group_attentions_arithmetic`` counts the multiply-adds skipped.

The graph computes exactly the output patches upstream's pipeline computes for the horizon a call asks:
``Chronos2Pipeline.predict`` runs the model with ``ceil(prediction_length / output_patch_size)`` patches, and
since the output patches attend to each other (and to the context), a graph of more patches cut to the horizon
forecasts differently (at the published config: ``benchmarks/results/export_parity_published.md``). So the
number of output patches is an input: ``future_covariates``' time axis is dynamic, ``output_patch_size`` x
patches long, and the graph computes as many patches as it holds (the model's ``num_output_patches`` is
``future_covariates.shape[-1] // output_patch_size``, a symbol the exporter follows). The metadata says so
(``short_horizon: output_patches``) and the worker sends ``ceil(horizon / output_patch_size)`` patches of future
(:mod:`distributed_onnx.model.horizons`): one graph serves every horizon up to ``horizon_patches``
(:func:`output_patches`: ``--horizon``'s, default the model's ``max_output_patches``) as upstream computes it,
and a shorter horizon is less work (a 64-step call at the published config computes 4 patches, not 64).

The parity report runs the upstream pipeline's own ``predict`` and this package's ONNX Runtime worker on the
same windows (the user's ``--data`` or seeded sample windows with gaps) and records the largest difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from distributed_onnx.errors import ConfigError
from distributed_onnx.export.graph import quiet_loggers, save_program
from distributed_onnx.export.metadata import described, resolution_of, write_metadata
from distributed_onnx.export.parity_check import UpstreamForecast, finish, parity_report, parity_windows
from distributed_onnx.export.pretrained import pretrained_folder
from distributed_onnx.export.progress import phase
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.model.checkpoint import CheckpointMetadata

#: The upstream exporter's names, in its order (the adapter reads the variant from them).
INPUT_NAMES = ("context", "group_ids", "attention_mask", "future_covariates")
OUTPUT_NAME = "quantile_preds"


def export(request: ExportRequest) -> ExportResult:
    """Export ``request.folder`` to ``request.output`` with its metadata and a parity report."""
    resolution = resolution_of(request)  # --data checked before the model loads
    output = request.output
    with pretrained_folder(request, "Chronos-2"):
        pipeline = load_pipeline(request.folder)
        model = pipeline.model.eval()
        config = model.chronos_config
        patches = output_patches(request.horizon, config)
        metadata = CheckpointMetadata(
            model_family="chronos2",
            input_names=list(INPUT_NAMES),
            output_name=OUTPUT_NAME,
            native_quantiles=[float(q) for q in config.quantiles],
            context_length=int(config.context_length),
            output_patch_size=int(config.output_patch_size),
            horizon_patches=patches,
            short_horizon="output_patches",  # the graph's patch count follows future_covariates' width
            resolution_minutes=resolution,
            description=f"Chronos-2 exported from {request.folder.name} (chronos-forecasting "
            f"{_upstream_version()}); weights in {output.name}.data",
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    export_graph(model, output)
    metadata_path = write_metadata(output, described(request, metadata))
    windows, source = parity_windows(request, metadata.context_length, metadata.resolution_minutes)
    horizon = request.horizon or metadata.horizon_length
    parity = parity_report(_upstream_forecast(pipeline), output, windows, horizon, source)
    return finish(request, metadata_path, parity)


def output_patches(horizon: int | None, config: Any) -> int:
    """The checkpoint's ``horizon_patches``, the most a run may ask: ``ceil(horizon / output_patch_size)``;
    ``None``: upstream's default prediction length (``max_output_patches``). Beyond ``max_output_patches``
    upstream unrolls (feeding its medians back), which this contract cannot: refused."""
    size, most = int(config.output_patch_size), int(config.max_output_patches)
    if horizon is None:
        return most
    patches = -(-horizon // size)
    if patches > most:
        raise ConfigError(
            f"--horizon {horizon} needs {patches} output patches of {size} steps; this model computes at most "
            f"{most} ({most * size} steps) in one call: export with --horizon {most * size} or less",
            key="horizon",
        )
    return patches


def load_pipeline(pretrained_dir: Path) -> Any:
    """``Chronos2Pipeline.from_pretrained`` on a local folder (never the hub: a missing folder is refused here)."""
    if not (pretrained_dir / "config.json").is_file():
        raise ConfigError(
            f"{pretrained_dir} is not a pretrained Chronos-2 folder (no config.json): give the folder that "
            "Chronos2Pipeline.save_pretrained wrote or that holds the downloaded model files.",
            key="from_pretrained",
        )
    from chronos.chronos2 import Chronos2Model
    from chronos.chronos2.pipeline import Chronos2Pipeline

    pipeline = Chronos2Pipeline.from_pretrained(str(pretrained_dir), local_files_only=True)
    if not isinstance(pipeline.model, Chronos2Model):
        raise ConfigError(f"{pretrained_dir} holds a {type(pipeline.model).__name__}, not a Chronos-2 model.")
    return pipeline


def export_graph(model: Any, output: Path) -> None:
    """``model`` in the upstream contract as ``output`` (+ ``output.data``), the batch axis dynamic and the number
    of output patches too: as many as ``future_covariates``' time axis holds, 1 to ``max_output_patches``."""
    import torch

    config = model.chronos_config
    size, most = int(config.output_patch_size), int(config.max_output_patches)
    graph = _UpstreamContract(model, size)
    rows, context_length = 4, int(config.context_length)
    # Traced at 2 patches: an axis traced at size 1 is specialized to a constant by torch.export.
    horizon = 2 * size
    generator = torch.Generator().manual_seed(0)
    context = torch.randn(rows, context_length, generator=generator)
    context[:, :3] = float("nan")
    sample = (
        context,
        torch.tensor([0, 0, 1, 2], dtype=torch.int64),
        torch.isfinite(context).to(torch.float32),
        torch.full((rows, horizon), float("nan")),
    )
    batch = torch.export.Dim("rows", min=1)
    output_patches_axis = torch.export.Dim("output_patches", min=1, max=max(most, 2))
    dynamic: dict[str, dict[int, Any]] = {name: {0: batch} for name in INPUT_NAMES}
    dynamic["future_covariates"][1] = size * output_patches_axis
    # onnx_ir logs every deduplicated initializer at INFO (hundreds of lines for a real model).
    with export_patches(model), torch.no_grad(), quiet_loggers("onnx_ir"):
        phase(f"tracing and exporting the graph (1 to {most} output patches, by future_covariates' length)")
        program = torch.onnx.export(
            graph,
            sample,
            dynamo=True,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_shapes=dynamic,
            external_data=True,
            verbose=False,
            optimize=False,  # its own phase in save_program
        )
    if program is None:  # typed Optional upstream; the dynamo exporter always returns one
        raise ConfigError("torch.onnx.export returned no program")
    save_program(program, output)


class _UpstreamContract:
    """Built lazily as a ``torch.nn.Module`` (torch is imported only when exporting): the model's ``forward``
    with the contract's four inputs, computing as many output patches as ``future_covariates`` is long."""

    def __new__(cls, model: Any, output_patch_size: int) -> Any:
        import torch

        class UpstreamContract(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(
                self,
                context: torch.Tensor,
                group_ids: torch.Tensor,
                attention_mask: torch.Tensor,
                future_covariates: torch.Tensor,
            ) -> torch.Tensor:
                out = self.model(
                    context=context,
                    context_mask=attention_mask,
                    group_ids=group_ids,
                    future_covariates=future_covariates,
                    num_output_patches=future_covariates.shape[-1] // output_patch_size,
                )
                return cast(torch.Tensor, out.quantile_preds)

        return UpstreamContract().eval()


@contextlib.contextmanager
def export_patches(model: Any) -> Iterator[None]:
    """Swap the methods that do not export and the group attention for its solo-aware form (see the module
    docstring), and give each of ``model``'s group attentions its folded value-output matrix; all undone on exit."""
    from chronos.chronos2 import layers
    from chronos.chronos2 import model as upstream

    originals = (
        upstream.Chronos2Model.__dict__["_prepare_patched_future"],
        upstream.Chronos2Encoder.__dict__["_construct_and_invert_group_time_mask"],
        layers.GroupSelfAttention.__dict__["forward"],
    )
    groups = [module for module in model.modules() if isinstance(module, layers.GroupSelfAttention)]
    upstream.Chronos2Model._prepare_patched_future = _prepare_patched_future_unchecked
    upstream.Chronos2Encoder._construct_and_invert_group_time_mask = staticmethod(_float_group_time_mask)
    layers.GroupSelfAttention.forward = _solo_aware_group_attention(originals[2])
    try:
        for module in groups:
            attention = module.self_attention
            # o(v(x)) = x Wv^T Wo^T = x (Wo Wv)^T: one d_model x d_model product instead of two.
            folded = (attention.o.weight @ attention.v.weight).detach()
            module.register_buffer(_FOLDED, folded, persistent=False)
        yield
    finally:
        for module in groups:
            module._buffers.pop(_FOLDED, None)
        upstream.Chronos2Model._prepare_patched_future = originals[0]
        upstream.Chronos2Encoder._construct_and_invert_group_time_mask = originals[1]
        layers.GroupSelfAttention.forward = originals[2]


#: The buffer :func:`export_patches` gives each group attention: ``Wo @ Wv`` (its value and output projections).
_FOLDED = "solo_value_output"


def _solo_aware_group_attention(upstream_forward: Any) -> Any:
    """Upstream's ``GroupSelfAttention.forward`` (``upstream_forward``) when some query may attend to another
    row, and ``h + LN(h) (Wo Wv)^T`` when none can (every row its own group: a univariate call), chosen in the
    graph (``torch.cond``, an ONNX ``If``). See the module docstring for why the two give the same forecasts."""

    def forward(self: Any, hidden_states: Any, attention_mask: Any, output_attentions: bool = False) -> Any:
        import torch
        from chronos.chronos2.layers import AttentionOutput

        if output_attentions:
            return upstream_forward(self, hidden_states, attention_mask, output_attentions)
        # attention_mask: [time, 1, query row, key row]; 0 where the query may attend the key, finfo.min where not.
        rows = attention_mask.shape[-1]
        other_row = torch.logical_not(torch.eye(rows, dtype=torch.bool, device=attention_mask.device))
        solo = torch.logical_not(((attention_mask == 0) & other_row).any())

        def own_row(states: Any, mask: Any) -> Any:
            return states + torch.nn.functional.linear(self.layer_norm(states), getattr(self, _FOLDED))

        def across_rows(states: Any, mask: Any) -> Any:
            return upstream_forward(self, states, mask).hidden_states

        out = torch.cond(solo, own_row, across_rows, (hidden_states, attention_mask))
        return AttentionOutput(hidden_states=out, attn_weights=None)

    return forward


def _prepare_patched_future_unchecked(
    self: Any,
    future_covariates: Any,
    future_covariates_mask: Any,
    loc_scale: Any,
    num_output_patches: int,
    batch_size: int,
) -> tuple[Any, Any]:
    """Upstream 2.3.2's ``_prepare_patched_future`` without its data-dependent NaN check (cannot fire when the
    mask is derived from NaN, as in this contract); every other line is upstream's."""
    import torch
    from einops import rearrange, repeat

    output_patch_size = self.chronos_config.output_patch_size
    if future_covariates is not None:
        future_covariates, _ = self.instance_norm(future_covariates, loc_scale)
        future_covariates = future_covariates.to(self.dtype)
        if future_covariates_mask is None:
            future_covariates_mask = torch.isnan(future_covariates).logical_not().to(future_covariates.dtype)
        future_covariates = torch.where(future_covariates_mask > 0.0, future_covariates, 0.0)
        if num_output_patches * output_patch_size > future_covariates.shape[-1]:
            padding_shape = (
                *future_covariates.shape[:-1],
                num_output_patches * output_patch_size - future_covariates.shape[-1],
            )
            future_covariates = torch.cat([future_covariates, torch.zeros(padding_shape).to(future_covariates)], dim=-1)
            future_covariates_mask = torch.cat(
                [future_covariates_mask, torch.zeros(padding_shape).to(future_covariates_mask)], dim=-1
            )
        patched_future_covariates = rearrange(
            future_covariates, "b (n p) -> b n p", n=num_output_patches, p=output_patch_size
        )
        patched_future_covariates_mask = rearrange(
            future_covariates_mask, "b (n p) -> b n p", n=num_output_patches, p=output_patch_size
        )
    else:
        shape = (batch_size, num_output_patches, output_patch_size)
        patched_future_covariates = torch.zeros(*shape, device=self.device, dtype=self.dtype)
        patched_future_covariates_mask = torch.zeros(*shape, device=self.device, dtype=self.dtype)
    final_future_length = num_output_patches * output_patch_size
    future_time_enc = torch.arange(start=0, end=final_future_length, device=self.device, dtype=torch.float32)
    future_time_enc = (
        repeat(future_time_enc, "(n p) -> b n p", b=batch_size, n=num_output_patches, p=output_patch_size)
        .div(self.chronos_config.time_encoding_scale)
        .to(self.dtype)
    )
    patched_future = torch.cat([future_time_enc, patched_future_covariates, patched_future_covariates_mask], dim=-1)
    return patched_future, patched_future_covariates_mask


def _float_group_time_mask(group_ids: Any, attention_mask: Any, floating_type: Any) -> Any:
    """Upstream's group-time mask with the group mask as 0/1 floats (a bool ``einsum`` exports invalid ONNX)."""
    import torch
    from einops import rearrange

    group_mask = (group_ids[:, None] == group_ids[None, :]).to(attention_mask.dtype)
    group_time_mask = torch.einsum("qb, bt -> qbt", group_mask, attention_mask)
    if torch.is_floating_point(group_time_mask):
        floating_type = group_time_mask.dtype
    group_time_mask = rearrange(group_time_mask, "q b t -> t 1 q b")
    return (1.0 - group_time_mask) * torch.finfo(floating_type).min


# ------------------------------------------------------------------------------------------------ parity


def _upstream_forecast(pipeline: Any) -> UpstreamForecast:
    """Upstream ``Chronos2Pipeline.predict`` (torch, CPU) as the parity report's reference: ``[W, H, Q]``."""
    import torch

    def forecast(contexts: np.ndarray, horizon: int) -> np.ndarray:
        predicted = pipeline.predict(
            [torch.from_numpy(row[None, :].copy()) for row in contexts], prediction_length=horizon, batch_size=256
        )
        return np.stack([p[0].numpy() for p in predicted]).transpose(0, 2, 1)

    return forecast


def _upstream_version() -> str:
    from importlib import metadata

    return metadata.version("chronos-forecasting")
