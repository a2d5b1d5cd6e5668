"""Batch-size buckets of a CUDA-graph session: which bucket a batch runs in, and how it is padded to it.

A captured CUDA graph replays fixed shapes at fixed addresses, so a session keeps one set of device buffers per
bucket and every batch runs in the smallest bucket that holds it: its rows go to the front, the rest of the
bucket is padding, and the padding rows are cut off the outputs. Pure numpy: no ONNX Runtime, no torch.

Padding must not change the real rows' outputs. The rows of these models meet only through integer row labels
(Chronos-2's ``group_ids``: rows sharing a group attend to each other), so padding rows hold zeros in float and
bool tensors and, in integer tensors, one label that no real row carries: the padding is a group of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distributed_onnx.errors import InputValidationError
from distributed_onnx.model.backend.validation import TensorSpec


@dataclass(frozen=True)
class BucketPlan:
    """The batch sizes (rows) a session captures graphs for, and what a larger batch gets.

    ``strict`` (an explicit provider chain): a batch above the largest bucket is refused. Otherwise (a policy
    chain) it runs without a graph, and the backend says so once in the log.
    """

    buckets: tuple[int, ...]
    strict: bool = True

    def __post_init__(self) -> None:
        if not self.buckets or any(rows <= 0 for rows in self.buckets) or list(self.buckets) != sorted(self.buckets):
            raise ValueError(f"buckets must be positive row counts in increasing order, got {list(self.buckets)}")

    @property
    def largest(self) -> int:
        return self.buckets[-1]

    def select(self, rows: int) -> int | None:
        """The smallest bucket that holds ``rows``; None for an empty batch or one above the largest bucket."""
        if rows <= 0:
            return None
        index = bisect.bisect_left(self.buckets, rows)
        return self.buckets[index] if index < len(self.buckets) else None

    def graph_id(self, bucket: int) -> int:
        """The ``gpu_graph_id`` of a bucket: its position, so every bucket keeps its own captured graph."""
        return self.buckets.index(bucket)


def effective_buckets(configured: Sequence[int], fixed_rows: int | None) -> tuple[int, ...]:
    """A graph whose batch axis is fixed runs exactly that many rows, whatever buckets were configured."""
    return (fixed_rows,) if fixed_rows is not None else tuple(sorted(set(configured)))


def fixed_batch(specs: Sequence[TensorSpec]) -> int | None:
    """The batch size of a graph whose inputs all fix axis 0 to one number, else None."""
    sizes = {spec.shape[0] for spec in specs if spec.shape}
    if len(sizes) == 1:
        (size,) = sizes
        return size if isinstance(size, int) else None
    return None


def bucket_shape(spec: TensorSpec, rows: int) -> tuple[int, ...]:
    """The shape of ``spec`` in a bucket of ``rows``: axis 0 is the batch, every other axis is fixed.

    :func:`distributed_onnx.model.backend.cuda.graph_capture.capture_problems` refuses graphs for which this is not so.
    """
    trailing = spec.shape[1:]
    if not all(isinstance(dim, int) for dim in trailing):
        raise ValueError(f"{spec.describe()} has dynamic axes besides the batch axis; it has no bucket shape")
    return (rows, *(int(dim) for dim in trailing))  # type: ignore[arg-type]


def padding_label(labels: np.ndarray) -> int:
    """An integer that no element of ``labels`` equals and that ``labels.dtype`` can hold.

    One past the largest label when that fits the dtype, else one below the smallest, else the first gap.
    """
    if labels.size == 0:
        return 0
    info = np.iinfo(labels.dtype)
    high = int(labels.max())
    if high < info.max:
        return high + 1
    low = int(labels.min())
    if low > info.min:
        return low - 1
    used = np.unique(labels)
    gaps = np.flatnonzero(np.diff(used) > 1)
    if gaps.size == 0:
        msg = f"cannot pad a batch whose {labels.dtype} labels take every value of the type"
        raise InputValidationError(msg)
    return int(used[gaps[0]]) + 1


def padding_value(real: np.ndarray) -> Any:
    """What padding rows hold after the real rows ``real``: a fresh label for integers, else zero (False)."""
    if np.issubdtype(real.dtype, np.integer):
        return padding_label(real)
    return real.dtype.type(0)


def fill_padding(buffer: np.ndarray, rows: int) -> None:
    """Write the padding rows ``buffer[rows:]`` of a bucket whose first ``rows`` rows hold the batch."""
    if rows < buffer.shape[0]:
        buffer[rows:] = padding_value(buffer[:rows])


def batch_rows(inputs: Mapping[str, Any], specs: Sequence[TensorSpec]) -> int:
    """Rows of a validated batch; every input must have them on axis 0, as one batch in one bucket."""
    sizes = {spec.name: int(inputs[spec.name].shape[0]) for spec in specs}
    if len(set(sizes.values())) > 1:
        raise InputValidationError(
            f"Inputs disagree on the batch axis (axis 0): {sizes}; a CUDA-graph session runs them as one batch.",
            shapes={name: [rows] for name, rows in sizes.items()},
        )
    return next(iter(sizes.values()))
