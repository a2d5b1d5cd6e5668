"""Model-family adapters: windows <-> a family's named tensors, outputs -> a native quantile block.

The family is chosen by the checkpoint metadata's ``model_family``, through :func:`adapter_for`; nothing
above this layer branches on family names. An adapter receives windows already laid out on the model's own
grid (``context_length`` columns of context, ``horizon_length`` columns of future, NaN = missing) and returns
``[windows, n_native_quantiles, horizon_length]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from distributed_onnx.checkpoint import CheckpointMetadata
from distributed_onnx.errors import ConfigError


class ModelAdapter(Protocol):
    """Family-specific tensor building and output decoding."""

    @property
    def supports_covariates(self) -> bool: ...

    def build_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``context`` [W, C] float32 and ``covariates`` [W, K, C + H] -> (named tensors, target row per window)."""
        ...

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        """Model outputs -> ``[W, n_native_quantiles, H]`` float32 for the windows' target rows."""
        ...


AdapterFactory = Callable[[CheckpointMetadata], ModelAdapter]
_REGISTRY: dict[str, AdapterFactory] = {}


def register_adapter(model_family: str, factory: AdapterFactory) -> None:
    """Make ``model_family`` known (third-party families register here too)."""
    _REGISTRY[model_family] = factory


def adapter_for(metadata: CheckpointMetadata) -> ModelAdapter:
    """The adapter of the checkpoint's ``model_family``."""
    try:
        factory = _REGISTRY[metadata.model_family]
    except KeyError:
        raise ConfigError(
            f"No adapter for model_family {metadata.model_family!r}; known families: {sorted(_REGISTRY)}. "
            "Register one with distributed_onnx.adapters.register_adapter.",
            model_family=metadata.model_family,
        ) from None
    return factory(metadata)


def zero_fill(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NaN -> 0.0 plus a float32 observed-mask (1 = observed), the convention of Chronos-2 and OpenSTEF."""
    observed = np.isfinite(block)
    return np.where(observed, block, 0.0).astype(np.float32), observed.astype(np.float32)
