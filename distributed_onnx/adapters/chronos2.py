"""The Chronos-2 tensor contract, fed exactly as OpenSTEF feeds it.

Each window is a *group*: its target row plus one row per known-future covariate, sharing a ``group_id`` so
the model attends across them. Covariate rows carry their history in ``context`` and their known future in
``future_covariates``; the target row's future is what the model predicts, so it is zero with mask 0.
When the checkpoint freezes the covariate axis (``max_covariates``), groups are padded with all-missing rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from distributed_onnx.adapters.base import zero_fill
from distributed_onnx.checkpoint import CheckpointMetadata
from distributed_onnx.errors import InputValidationError


class Chronos2Adapter:
    """Windows <-> ``context, attention_mask, group_ids, future_covariates, future_covariates_mask``."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        self._context_length = metadata.context_length
        self._horizon = metadata.horizon_length
        self._max_covariates = metadata.max_covariates
        self._output_name = metadata.output_name

    @property
    def supports_covariates(self) -> bool:
        return True

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        n_windows = context.shape[0]
        n_covariates = 0 if covariates is None else covariates.shape[1]
        if self._max_covariates is not None and n_covariates > self._max_covariates:
            raise InputValidationError(
                f"{n_covariates} covariates given, but the checkpoint's covariate axis is frozen at "
                f"{self._max_covariates}: drop covariates or use a checkpoint with a dynamic covariate axis."
            )
        rows_per_group = 1 + (self._max_covariates if self._max_covariates is not None else n_covariates)
        width = self._context_length + self._horizon
        grid = np.full((n_windows, rows_per_group, width), np.nan, dtype=np.float32)
        grid[:, 0, : self._context_length] = context  # target row: history only
        if covariates is not None and n_covariates:
            grid[:, 1 : 1 + n_covariates, :] = covariates
        values, mask = zero_fill(grid.reshape(n_windows * rows_per_group, width))
        history, future = slice(0, self._context_length), slice(self._context_length, width)
        inputs = {
            "context": np.ascontiguousarray(values[:, history]),
            "attention_mask": np.ascontiguousarray(mask[:, history]),
            "group_ids": np.repeat(np.arange(n_windows, dtype=np.int64), rows_per_group),
            "future_covariates": np.ascontiguousarray(values[:, future]),
            "future_covariates_mask": np.ascontiguousarray(mask[:, future]),
        }
        return inputs, np.arange(n_windows, dtype=np.int64) * rows_per_group

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        return np.asarray(outputs[self._output_name], dtype=np.float32)[target_rows]
