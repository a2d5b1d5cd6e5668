"""Checks a batch of named tensors against what the session declares, before ONNX Runtime sees it.

Pure code over :class:`TensorSpec` values, so the checks are unit-testable without a session. Messages name
the tensor, what was expected and what was given; ORT's own errors say far less. Only what ORT itself would
reject is checked (names, dtypes, ranks, fixed dims, shared symbolic axes): tensor *values* are not, because
which values may be NaN or infinite is a model family's contract (the adapters own that rule). A transformer
export's additive attention mask legitimately holds ``-inf``, and the upstream Chronos-2 export marks unknown
values with NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distributed_onnx.errors import InputValidationError


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, element type and shape (``None`` or a name for a symbolic axis)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...]

    def describe(self) -> str:
        dims = ", ".join("?" if dim is None else str(dim) for dim in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


def validate_inputs(
    inputs: Mapping[str, Any],
    specs: Sequence[TensorSpec],
) -> None:
    """Raise :class:`InputValidationError` unless ``inputs`` fit ``specs`` exactly.

    Checks names (missing and unexpected), dtypes, ranks, fixed dimensions, that symbolic axes sharing a
    name agree across tensors (the batch axis).
    """
    expected = {spec.name for spec in specs}
    missing = [spec.name for spec in specs if spec.name not in inputs]
    unexpected = sorted(set(inputs) - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unexpected:
            parts.append(f"unexpected {unexpected}")
        raise InputValidationError(
            f"Input names do not match the model: {'; '.join(parts)}. "
            f"The model takes {[spec.describe() for spec in specs]}.",
            missing=missing,
            unexpected=unexpected,
        )
    symbolic: dict[str, tuple[str, int]] = {}
    for spec in specs:
        value = inputs[spec.name]
        dtype, shape = _dtype_and_shape(value)
        if dtype != spec.dtype:
            raise InputValidationError(
                f"Input {spec.name!r} has dtype {dtype}, expected {spec.dtype} ({spec.describe()}).",
                tensor=spec.name,
            )
        if len(shape) != len(spec.shape):
            raise InputValidationError(
                f"Input {spec.name!r} has rank {len(shape)} (shape {tuple(shape)}), expected rank "
                f"{len(spec.shape)} ({spec.describe()}).",
                tensor=spec.name,
            )
        for axis, (given, wanted) in enumerate(zip(shape, spec.shape, strict=True)):
            if isinstance(wanted, int) and given != wanted:
                raise InputValidationError(
                    f"Input {spec.name!r} has size {given} on axis {axis} (shape {tuple(shape)}), expected "
                    f"{wanted} ({spec.describe()}).",
                    tensor=spec.name,
                )
            if isinstance(wanted, str):
                seen = symbolic.setdefault(wanted, (spec.name, given))
                if seen[1] != given:
                    raise InputValidationError(
                        f"Axis {wanted!r} is {seen[1]} in input {seen[0]!r} but {given} in input "
                        f"{spec.name!r}: tensors sharing that axis must agree.",
                        tensor=spec.name,
                    )


def _dtype_and_shape(value: Any) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """dtype and shape of a numpy array, or of a DLPack-capable device tensor (torch) without copying it."""
    if isinstance(value, np.ndarray):
        return value.dtype, value.shape
    shape = getattr(value, "shape", None)
    torch_dtype = getattr(value, "dtype", None)
    if shape is None or torch_dtype is None:
        raise InputValidationError(
            f"Input of type {type(value).__name__} is neither a numpy array nor a tensor with shape and dtype."
        )
    # torch dtypes print as "torch.float32"; numpy understands the part after the dot.
    return np.dtype(str(torch_dtype).removeprefix("torch.")), tuple(int(dim) for dim in shape)
