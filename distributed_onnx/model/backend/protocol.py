"""The :class:`InferenceBackend` contract: named tensors in, named tensors out.

Everything above the backend (adapters, workers, actors, serving) depends on this Protocol only, never on
ONNX Runtime, so those layers can be unit-tested with a small fake typed against it. It holds every member
those layers use (the tensors a graph declares, the providers realized, whether inputs are bound on a
device), so each use is checked by the type checker rather than probed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from distributed_onnx.model.backend.validation import TensorSpec
from distributed_onnx.model.checkpoint import CheckpointMetadata


@runtime_checkable
class InferenceBackend(Protocol):
    """A loaded model: built once, then ``run`` many times over batches of named tensors."""

    @property
    def metadata(self) -> CheckpointMetadata:
        """The checkpoint metadata (tensor names, quantile grid, context/horizon sizing)."""
        ...

    @property
    def input_specs(self) -> Sequence[TensorSpec]:
        """The graph's inputs as declared (a fixed batch axis is an int: a static-shape graph takes only that)."""
        ...

    @property
    def output_specs(self) -> Sequence[TensorSpec]:
        """The graph's outputs as declared (serving describes and selects them by these)."""
        ...

    @property
    def providers(self) -> Sequence[str]:
        """The execution providers realized, preferred first (reported per worker)."""
        ...

    @property
    def uses_io_binding(self) -> bool:
        """True when inputs are bound on a device (a GPU): packing the next batch then overlaps the model."""
        ...

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Run the model on one batch; keys of ``inputs`` are the metadata's ``input_names``."""
        ...

    def close(self) -> None:
        """Release the runtime resources; ``run`` afterwards raises ``BackendClosedError``."""
        ...
