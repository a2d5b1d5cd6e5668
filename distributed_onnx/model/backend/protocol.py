"""The :class:`InferenceBackend` contract: named tensors in, named tensors out.

Everything above the backend (adapters, workers, actors, serving) depends on this Protocol only, never on
ONNX Runtime, so those layers can be unit-tested with a small fake typed against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from distributed_onnx.model.checkpoint import CheckpointMetadata


@runtime_checkable
class InferenceBackend(Protocol):
    """A loaded model: built once, then ``run`` many times over batches of named tensors."""

    @property
    def metadata(self) -> CheckpointMetadata:
        """The checkpoint metadata (tensor names, quantile grid, context/horizon sizing)."""
        ...

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Run the model on one batch; keys of ``inputs`` are the metadata's ``input_names``."""
        ...

    def close(self) -> None:
        """Release the runtime resources; ``run`` afterwards raises ``BackendClosedError``."""
        ...
