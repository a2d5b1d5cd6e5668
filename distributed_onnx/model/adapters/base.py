"""Model-family adapters: windows <-> a family's named tensors, outputs -> a native quantile block.

The family is chosen by the checkpoint metadata's ``model_family``, through :func:`adapter_for`; nothing
above this layer branches on family names. An adapter receives windows already laid out on the model's own
grid (``context_length`` columns of context, ``horizon_length`` columns of future, NaN = missing) and returns
``[windows, n_native_quantiles, horizon_length]``.

Which tensor values may be NaN is a property of the family's contract, not of ONNX Runtime, so the adapters
own that rule (the backend only checks what ORT itself would reject: names, dtypes, ranks, fixed dims).
Windows mark a missing value with NaN and never with an infinity: an adapter refuses infinite window values,
and :meth:`ModelAdapter.check_tensors` applies the family's rule to tensors a client sends as they are
(the Open Inference Protocol route).

Which families exist, built in or a plugin's (an entry point of the group ``distributed_onnx.model_families``),
is the family registry's, :mod:`distributed_onnx.model.families`; :func:`adapter_for` asks it the first time a
checkpoint of a family is met, in whatever process meets it (the driver, every actor, every Serve replica), so a
plugin installed on the nodes reaches all of them; :func:`register_adapter` only reaches the process that calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from distributed_onnx.errors import CheckpointGraphMismatchError, InputValidationError
from distributed_onnx.model import families
from distributed_onnx.model.checkpoint import CheckpointMetadata


class ModelAdapter(Protocol):
    """Family-specific tensor building, output decoding and the family's rule for non-finite values."""

    @property
    def supports_covariates(self) -> bool: ...

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``context`` [W, C] float32 and ``covariates`` [W, K, C + H] -> (named tensors, target row per window).

        NaN marks a missing value; infinite values raise :class:`InputValidationError`.
        """
        ...

    def check_tensors(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Raise :class:`InputValidationError` if named model tensors hold NaN/inf the family does not allow."""
        ...

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        """Model outputs -> ``[W, n_native_quantiles, H]`` float32 for the windows' target rows."""
        ...

    def target_windows(self, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of :meth:`build_inputs` for tensors a client built: ``(context [W, C], target rows)``.

        ``context`` holds each window's history as the model saw it (float32, NaN = missing, as the family's
        masks say); ``target_rows`` are the rows whose outputs :meth:`decode` reads. The serving side logs and
        shadows an Open Inference Protocol request through it (tensors checked against the session first).
        """
        ...


AdapterFactory = Callable[[CheckpointMetadata], ModelAdapter]
#: Families registered in this process by :func:`register_adapter` (they win over the family registry).
_REGISTRY: dict[str, AdapterFactory] = {}


def register_adapter(model_family: str, factory: AdapterFactory) -> None:
    """Make ``model_family`` known in this process (a test, a notebook). To reach Ray's actors and Serve's
    replicas, a family is a plugin instead: an entry point of ``families.PLUGIN_GROUP`` (docs/plugins.md)."""
    _REGISTRY[model_family] = factory


def adapter_for(metadata: CheckpointMetadata) -> ModelAdapter:
    """The adapter of the checkpoint's ``model_family``: registered in this process, else the family registry's
    (:mod:`distributed_onnx.model.families`: built in, or an installed plugin's)."""
    name = metadata.model_family
    factory = _REGISTRY.get(name)
    if factory is not None:
        families.refuse_shadowing_plugin(name)
    else:
        factory = families.adapter_factory(families.family(name, registered=list(_REGISTRY)))
    adapter: ModelAdapter = factory(metadata)
    return adapter


def zero_fill(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NaN -> 0.0 plus a float32 observed-mask (1 = observed), the convention of Chronos-2 and OpenSTEF."""
    observed = np.isfinite(block)
    return np.where(observed, block, 0.0).astype(np.float32), observed.astype(np.float32)


def refuse_infinite_windows(context: np.ndarray, covariates: np.ndarray | None) -> None:
    """Refuse infinite window values: NaN is the one missing marker, an infinity is a broken value.

    Without this an infinity would be masked like a gap (``np.isfinite`` is False for it) and the forecast
    would silently ignore it.
    """
    refuse_non_finite("context", context, nan_allowed=True, axes=("window", "step"))
    if covariates is not None:
        refuse_non_finite("covariates", covariates, nan_allowed=True, axes=("window", "covariate", "step"))


def refuse_non_finite(name: str, values: np.ndarray, *, nan_allowed: bool, axes: Sequence[str] | None = None) -> None:
    """Raise :class:`InputValidationError` if float ``values`` hold an infinity, or a NaN unless ``nan_allowed``.

    The message names the tensor, the count and the first offending index (by ``axes`` names when given).
    Non-float tensors pass: they cannot hold either.
    """
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        return
    bad = np.isinf(array) if nan_allowed else ~np.isfinite(array)
    if not bad.any():
        return
    first = [int(i) for i in np.argwhere(bad)[0]]
    where = (
        ", ".join(f"{axis} {index}" for axis, index in zip(axes, first, strict=True))
        if axes is not None and len(axes) == len(first)
        else f"index {tuple(first)}"
    )
    if nan_allowed:
        what, rule = "infinite", "NaN marks a missing value; infinite values are refused"
    else:
        what, rule = "NaN/inf", "this model family takes missing values zero-filled and masked, never NaN or inf"
    raise InputValidationError(
        f"Input {name!r} holds {int(bad.sum())} {what} value(s), first at {where}: {rule}.", tensor=name
    )


def quantile_block(outputs: Mapping[str, np.ndarray], metadata: CheckpointMetadata, rows: int) -> np.ndarray:
    """The metadata's output tensor as ``[rows, n_native_quantiles, horizon_length]`` float32, by its layout.

    Checked after every call (a symbolic axis in the graph is only known then): a graph whose output is not
    what its metadata declares raises :class:`CheckpointGraphMismatchError` with both shapes, at the worker's
    warm-up, before any part of a run.
    """
    values = np.asarray(outputs[metadata.output_name], dtype=np.float32)
    n_levels, steps = len(metadata.native_quantiles), metadata.horizon_length
    expected = (rows, n_levels, steps) if metadata.output_layout == "quantile_step" else (rows, steps, n_levels)
    if values.shape != expected:
        axes = "rows, quantiles, steps" if metadata.output_layout == "quantile_step" else "rows, steps, quantiles"
        raise CheckpointGraphMismatchError(
            f"Output {metadata.output_name!r} has shape {values.shape}, but the metadata's output_layout "
            f"{metadata.output_layout!r} with {n_levels} native_quantiles and horizon_length {steps} means "
            f"{expected} ({axes}): fix output_layout, native_quantiles or output_patch_size x horizon_patches.",
            tensor=metadata.output_name,
        )
    return values if metadata.output_layout == "quantile_step" else np.ascontiguousarray(values.transpose(0, 2, 1))
