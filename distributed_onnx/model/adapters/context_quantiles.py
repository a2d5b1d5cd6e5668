"""The plain family: one ``context`` tensor in, one quantile tensor out, as the metadata's contract says.

For models exported without covariates: a linear or MLP quantile head over raw history, and the graphs of
families built the same way (Chronos-Bolt, TiRex: their records in :mod:`distributed_onnx.model.families` name
this adapter and narrow what their contract may be by their rules). ``input_names`` has one name, the context
``[rows, context_length]``. What differs between such graphs is declared in the metadata and followed here,
never guessed:

- ``missing_value``: ``"zero"`` sends a missing value as 0.0 (the graph has no mask, so it cannot tell a gap
  from an observed 0: this family's default, what checkpoints written before the field meant); ``"nan"``
  sends NaN, for graphs that derive their own mask from it. Which of them a family takes, and what null means,
  are its rules (a family without rules of its own, a plugin's bare factory, has this family's).
- ``output_layout``: ``[rows, quantiles, steps]`` or ``[rows, steps, quantiles]``; checked after every call
  (:func:`~distributed_onnx.model.adapters.base.quantile_block`).
- ``long_horizon``: how the worker reaches horizons beyond one call (``distributed_onnx/model/unroll.py``).
- ``short_horizon: output_patches``: the graph takes ``num_output_patches`` (a 0-d int64) after the context and
  computes that many output patches (TimesFM as exported here); it is sent the call's patch count
  (:func:`distributed_onnx.model.horizons.call_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.model.adapters.base import (
    quantile_block,
    refuse_infinite_windows,
    refuse_non_finite,
    zero_fill,
)
from distributed_onnx.model.checkpoint import CheckpointMetadata, MissingValue
from distributed_onnx.model.families import rules_of
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES, short_horizon_of


class ContextQuantilesAdapter:
    """Windows <-> ``{input_names[0]: context}`` (and ``num_output_patches`` where the graph takes it); covariates
    are refused (the graph cannot take them)."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        self.family = metadata.model_family
        names = list(metadata.input_names)
        self._asks_patches = names[1:] == [NUM_OUTPUT_PATCHES]
        if len(names) != 1 and not self._asks_patches:
            raise ConfigError(
                f"model_family {self.family!r} takes exactly one input, the context, or the context and "
                f"{NUM_OUTPUT_PATCHES!r}; metadata lists {metadata.input_names}",
                key="input_names",
            )
        if short_horizon_of(metadata) == "output_patches" and not self._asks_patches:
            raise ConfigError(
                f"short_horizon 'output_patches' means the graph computes the output patches it is asked, but this "
                f"{self.family} graph's inputs {metadata.input_names} have no {NUM_OUTPUT_PATCHES!r} to ask them "
                "with: set short_horizon 'first_steps' (or 'refuse') in its metadata, or export it again.",
                key="short_horizon",
            )
        rules = rules_of(self.family)
        self.missing_value: MissingValue = metadata.missing_value or rules.missing_value or "zero"
        if self.missing_value not in rules.missing_values:
            raise ConfigError(
                f"model_family {self.family!r} takes missing values as {sorted(rules.missing_values)}, "
                f"the metadata says missing_value {self.missing_value!r}: its graphs derive their mask from NaN, "
                "so a zero would be read as an observed 0. Fix the checkpoint's metadata.",
                key="missing_value",
            )
        self._metadata = metadata
        self._input_name = metadata.input_names[0]
        #: The call's output patches (``model/horizons.py``: the worker builds this adapter per patch count).
        self._patches = np.array(metadata.horizon_patches, dtype=np.int64)

    @property
    def supports_covariates(self) -> bool:
        return False

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The graph's inputs for ``context`` (``[windows, steps]``, NaN = missing) and the rows to decode.

        A missing value goes as the metadata's ``missing_value`` says (this family's default: 0.0), an infinite
        one is refused:

        >>> import numpy as np
        >>> from distributed_onnx.model.checkpoint import CheckpointMetadata
        >>> metadata = CheckpointMetadata(
        ...     model_family="context_quantiles", input_names=["context"], output_name="quantiles",
        ...     native_quantiles=[0.1, 0.5, 0.9], context_length=4, output_patch_size=2, horizon_patches=1,
        ...     resolution_minutes=30)
        >>> adapter = ContextQuantilesAdapter(metadata)
        >>> inputs, rows = adapter.build_inputs(np.array([[1.0, np.nan, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]]), None)
        >>> inputs["context"]
        array([[1. , 0. , 3. , 4. ],
               [0.5, 0.5, 0.5, 0.5]], dtype=float32)
        >>> rows
        array([0, 1])
        >>> adapter.decode({"quantiles": np.zeros((2, 3, 2), np.float32)}, rows).shape  # [rows, quantiles, steps]
        (2, 3, 2)
        >>> adapter.build_inputs(np.array([[1.0, np.inf, 3.0, 4.0]]), None)
        Traceback (most recent call last):
        ...
        distributed_onnx.errors.InputValidationError: Input 'context' holds 1 infinite value(s), first at window 0, ...
        """
        if covariates is not None and covariates.shape[1]:
            raise InputValidationError(f"model_family {self.family!r} takes no covariates")
        refuse_infinite_windows(context, None)
        if self.missing_value == "nan":
            values = np.ascontiguousarray(context, dtype=np.float32)
        else:
            values, _ = zero_fill(context)
        inputs: dict[str, np.ndarray] = {self._input_name: values}
        if self._asks_patches:
            inputs[NUM_OUTPUT_PATCHES] = self._patches
        return inputs, np.arange(context.shape[0], dtype=np.int64)

    def check_tensors(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, values in inputs.items():
            refuse_non_finite(name, values, nan_allowed=self.missing_value == "nan" and name == self._input_name)
        if self._asks_patches and NUM_OUTPUT_PATCHES in inputs:
            # The graph clamps what it is sent (0 answers no steps, 100 the whole horizon): a client's count
            # outside 1..horizon_patches is refused rather than answered as another call than it asked.
            asked = np.asarray(inputs[NUM_OUTPUT_PATCHES]).reshape(-1)
            most = self._metadata.horizon_patches
            if asked.size != 1 or not 1 <= int(asked[0]) <= most:
                raise InputValidationError(
                    f"{NUM_OUTPUT_PATCHES} must be one whole number from 1 to this graph's {most} output "
                    f"patch(es), got {asked.tolist()}.",
                    tensor=NUM_OUTPUT_PATCHES,
                )

    def target_windows(self, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Every row is a window; its context is the values as sent (NaN = missing when the graph takes NaN;
        with zero-filled graphs a 0 stays a 0, since the graph has no mask)."""
        context = np.asarray(inputs[self._input_name], dtype=np.float32)
        return context.reshape(context.shape[0], -1), np.arange(context.shape[0], dtype=np.int64)

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        # One output row per context row, the target rows being all of them.
        return quantile_block(outputs, self._metadata, int(target_rows.shape[0]))[target_rows]
