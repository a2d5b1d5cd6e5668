"""The plain family: one ``context`` tensor in (missing values zero-filled), one quantile tensor out.

For models exported without masks or covariates (a linear or MLP quantile head over raw history).
``input_names`` has one name, the context; the output is ``[rows, n_native_quantiles, horizon]``. The graph
has no mask, so it never sees NaN: missing values reach it as zeros.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.model.adapters.base import refuse_infinite_windows, refuse_non_finite, zero_fill
from distributed_onnx.model.checkpoint import CheckpointMetadata


class ContextQuantilesAdapter:
    """Windows <-> ``{input_names[0]: context}``; covariates are refused (the graph cannot take them)."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        if len(metadata.input_names) != 1:
            raise ConfigError(
                f"model_family 'context_quantiles' takes exactly one input, metadata lists {metadata.input_names}"
            )
        self._input_name = metadata.input_names[0]
        self._output_name = metadata.output_name

    @property
    def supports_covariates(self) -> bool:
        return False

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if covariates is not None and covariates.shape[1]:
            raise InputValidationError("model_family 'context_quantiles' takes no covariates")
        refuse_infinite_windows(context, None)
        values, _ = zero_fill(context)
        return {self._input_name: values}, np.arange(context.shape[0], dtype=np.int64)

    def check_tensors(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, values in inputs.items():
            refuse_non_finite(name, values, nan_allowed=False)

    def target_windows(self, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Every row is a window; its context is the values as sent (the graph has no mask: a 0 stays a 0)."""
        context = np.asarray(inputs[self._input_name], dtype=np.float32)
        return context.reshape(context.shape[0], -1), np.arange(context.shape[0], dtype=np.int64)

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        return np.asarray(outputs[self._output_name], dtype=np.float32)[target_rows]
