"""The Chronos-2 tensor contract, in the two variants published checkpoints use.

Each window is a *group*: its target row plus one row per known-future covariate, sharing a ``group_id`` so
the model attends across them. Covariate rows carry their history in ``context`` and their known future in
``future_covariates``; the target row's future is what the model predicts, so it is marked unknown. When the
checkpoint freezes the covariate axis (``max_covariates``), groups are padded with all-missing rows.

The variant is read from the metadata's ``input_names``:

- **OpenSTEF** (five inputs, ``future_covariates_mask`` among them): every tensor is NaN-free; an unknown
  value is 0 with mask 0, in the context and in the future alike.
- **Upstream** (amazon-science/chronos-forecasting ``scripts/onnx/``: ``context``, ``group_ids``,
  ``attention_mask``, ``future_covariates``): there is no future mask, so **NaN marks an unknown future
  value**; a zero there would tell the model that the future is known to be 0. Missing context values are NaN
  too, with ``attention_mask`` 0: the upstream model normalizes each row by the mean and spread of its
  non-NaN values (``InstanceNorm`` in ``chronos_bolt.py``) without looking at the mask, so a zero-filled gap
  would be counted as an observed 0. The exporter's ``--no_future_covariates`` graphs (three inputs) take no
  known-future values, and legacy exports that expose the traced ``num_output_patches`` scalar get it fed.

The future's width is the call's: ``horizon_length`` of the metadata it is built from, which for a graph whose
``future_covariates`` axis sets its output patches (``short_horizon: output_patches``, this package's exports) is
the call's patch count (:func:`distributed_onnx.model.horizons.call_metadata`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import numpy as np

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.model.adapters.base import refuse_infinite_windows, refuse_non_finite, zero_fill
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES, short_horizon_of


class Chronos2Variant(StrEnum):
    """Which Chronos-2 tensor contract a checkpoint speaks."""

    OPENSTEF = "openstef"
    UPSTREAM = "upstream"
    UPSTREAM_NO_COVARIATES = "upstream_no_covariates"


_VARIANT_INPUTS: dict[frozenset[str], Chronos2Variant] = {
    frozenset(
        {"context", "attention_mask", "group_ids", "future_covariates", "future_covariates_mask"}
    ): Chronos2Variant.OPENSTEF,
    frozenset({"context", "group_ids", "attention_mask", "future_covariates"}): Chronos2Variant.UPSTREAM,
    frozenset({"context", "group_ids", "attention_mask"}): Chronos2Variant.UPSTREAM_NO_COVARIATES,
}

#: Tensors of the upstream variants in which NaN means "unknown"; every other float tensor must be finite.
_UPSTREAM_NAN_INPUTS = frozenset({"context", "future_covariates"})


def detect_variant(input_names: Iterable[str]) -> Chronos2Variant:
    """The variant a set of input names belongs to; :class:`ConfigError` listing the known ones otherwise."""
    names = set(input_names)
    variant = _VARIANT_INPUTS.get(frozenset(names))
    if variant is None and NUM_OUTPUT_PATCHES in names:
        variant = _VARIANT_INPUTS.get(frozenset(names - {NUM_OUTPUT_PATCHES}))
        if variant is Chronos2Variant.OPENSTEF:
            variant = None  # only the upstream exporter traces that scalar
    if variant is None:
        known = [sorted(inputs) for inputs in _VARIANT_INPUTS]
        raise ConfigError(
            f"model_family 'chronos2' input_names {sorted(names)} match no known Chronos-2 variant: "
            f"OpenSTEF's {known[0]}, the upstream exporter's {known[1]} or, exported with "
            f"--no_future_covariates, {known[2]} (either upstream one optionally with {NUM_OUTPUT_PATCHES!r}).",
            key="input_names",
        )
    return variant


class Chronos2Adapter:
    """Windows <-> the named tensors of the checkpoint's Chronos-2 variant."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        self.variant = detect_variant(metadata.input_names)
        self._context_length = metadata.context_length
        self._horizon = metadata.horizon_length
        self._horizon_patches = metadata.horizon_patches
        self._max_covariates = metadata.max_covariates
        self._output_name = metadata.output_name
        self._num_output_patches = NUM_OUTPUT_PATCHES in metadata.input_names
        if short_horizon_of(metadata) == "output_patches" and (
            self.variant is Chronos2Variant.UPSTREAM_NO_COVARIATES or self._num_output_patches
        ):
            raise ConfigError(
                "short_horizon 'output_patches' means the graph computes as many output patches as its "
                f"future_covariates input is long, but this graph's inputs {sorted(metadata.input_names)} fix the "
                "count (no future_covariates, or a traced num_output_patches): set short_horizon 'refuse' or export "
                "it again with distributed-onnx export chronos2.",
                key="short_horizon",
            )

    @property
    def supports_covariates(self) -> bool:
        return self.variant is not Chronos2Variant.UPSTREAM_NO_COVARIATES

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        return self.build_grouped_inputs(context, covariates, np.arange(context.shape[0], dtype=np.int64))

    def build_grouped_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None, groups: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Every row of the windows with one ``groups`` value shares one ``group_id`` (cross-learning: upstream's
        ``cross_learning=True`` over exactly those windows); by default each window is its own group."""
        refuse_infinite_windows(context, covariates)
        n_windows = context.shape[0]
        groups = np.asarray(groups).reshape(-1)
        if groups.shape[0] != n_windows:
            raise InputValidationError(f"{groups.shape[0]} group labels for {n_windows} windows; give one per window.")
        n_covariates = 0 if covariates is None else covariates.shape[1]
        if n_covariates and not self.supports_covariates:
            raise InputValidationError(
                f"{n_covariates} covariates given, but this Chronos-2 export has no future_covariates input "
                "(exported with --no_future_covariates): drop the covariates or re-export with them."
            )
        if self._max_covariates is not None and n_covariates > self._max_covariates:
            raise InputValidationError(
                f"{n_covariates} covariates given, but the checkpoint's covariate axis is frozen at "
                f"{self._max_covariates}: drop covariates or use a checkpoint with a dynamic covariate axis."
            )
        rows_per_group = 1 + (self._max_covariates if self._max_covariates is not None else n_covariates)
        width = self._context_length + self._horizon
        grid = np.full((n_windows, rows_per_group, width), np.nan, dtype=np.float32)
        grid[:, 0, : self._context_length] = context  # target row: history only, its future unknown
        if covariates is not None and n_covariates:
            grid[:, 1 : 1 + n_covariates, :] = covariates
        rows = grid.reshape(n_windows * rows_per_group, width)
        history, future = slice(0, self._context_length), slice(self._context_length, width)
        _, window_group = np.unique(groups, return_inverse=True)
        group_ids = np.repeat(window_group.reshape(-1).astype(np.int64), rows_per_group)
        if self.variant is Chronos2Variant.OPENSTEF:
            values, mask = zero_fill(rows)
            inputs = {
                "context": np.ascontiguousarray(values[:, history]),
                "attention_mask": np.ascontiguousarray(mask[:, history]),
                "group_ids": group_ids,
                "future_covariates": np.ascontiguousarray(values[:, future]),
                "future_covariates_mask": np.ascontiguousarray(mask[:, future]),
            }
        else:  # upstream: NaN stays NaN (the model infers the future mask from it); the context mask is explicit
            inputs = {
                "context": np.ascontiguousarray(rows[:, history]),
                "attention_mask": np.isfinite(rows[:, history]).astype(np.float32),
                "group_ids": group_ids,
            }
            if self.variant is Chronos2Variant.UPSTREAM:
                inputs["future_covariates"] = np.ascontiguousarray(rows[:, future])
            if self._num_output_patches:
                inputs[NUM_OUTPUT_PATCHES] = np.array(self._horizon_patches, dtype=np.int64)
        return inputs, np.arange(n_windows, dtype=np.int64) * rows_per_group

    def check_tensors(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, values in inputs.items():
            nan_allowed = self.variant is not Chronos2Variant.OPENSTEF and name in _UPSTREAM_NAN_INPUTS
            refuse_non_finite(name, values, nan_allowed=nan_allowed)

    def target_windows(self, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One window per group (``group_ids``), its target the group's first row, as :meth:`build_inputs` lays
        them out (Chronos-2's own pipeline puts a group's target rows first); the other rows are covariates.

        A context value is missing where ``attention_mask`` is 0 (and, upstream, where it is NaN).
        """
        groups = np.asarray(inputs["group_ids"]).reshape(-1)
        rows = np.asarray(inputs["context"]).shape[0]
        if groups.shape[0] != rows:
            raise InputValidationError(
                f"group_ids has {groups.shape[0]} entries for {rows} context rows; send one group id per row.",
                tensor="group_ids",
            )
        _, first_rows = np.unique(groups, return_index=True)
        target_rows = np.sort(first_rows).astype(np.int64)
        context = np.asarray(inputs["context"], dtype=np.float32)[target_rows]
        observed = np.asarray(inputs["attention_mask"])[target_rows] > 0
        return np.where(observed, context, np.float32(np.nan)), target_rows

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        return np.asarray(outputs[self._output_name], dtype=np.float32)[target_rows]
