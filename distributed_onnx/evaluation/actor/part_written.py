"""Reading back the forecasts of a part that are already written, so a part is rescored without rerunning them.

A model whose part is written and verifies (its footer names this run, this part and the model's fingerprint, and
it holds the part's rows) is not run again: its forecasts are read back and rescored with the others, which is how
a checkpoint is added to a finished run (docs/design.md, Outputs). The driver says which models may have such a
part (:attr:`~..data.windows.PartSpec.written`): none on a fresh run, so a part then opens no footer at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.sums import model_part_verifies
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import quantile_column_name

__all__ = ["WrittenForecasts", "read_written"]


@dataclass(frozen=True)
class WrittenForecasts:
    """The forecasts ``[W, H, Q]`` of the models read back, and their window ids in plan order (``[W]``)."""

    values: dict[str, np.ndarray] = field(default_factory=dict)
    window_ids: dict[str, np.ndarray] = field(default_factory=dict)

    def batch(self, part_index: int, rows: slice, packed_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Each model's forecasts of the windows ``rows``, checked to be the windows packed now."""
        out = {}
        for name, values in self.values.items():
            if not np.array_equal(self.window_ids[name][rows], packed_ids):
                raise DataError(f"part {part_index} of {name}: the written windows are not the ones planned")
            out[name] = values[rows]
        return out

    def sizes(self, output: Location, part_index: int) -> dict[str, int]:
        """The bytes of each model's part read back (recorded beside the new sums)."""
        return {name: storage.file_size(outputs.part_path(output, name, part_index)) or 0 for name in self.values}


def read_written(
    output: Location,
    part_index: int,
    expected: Mapping[str, dict[str, Any]],
    windows: int,
    horizon: int,
    quantiles: tuple[float, ...],
) -> WrittenForecasts:
    """The forecasts of the models of ``expected`` (name -> the footer record its part must hold) whose part is
    already written and verifies, read back.

    A part that is unreadable now is recomputed (the write replaces it, or fails and is retried).
    """
    columns = [quantile_column_name(q) for q in quantiles]
    found = WrittenForecasts()
    for name, record in expected.items():
        try:
            if not model_part_verifies(output, name, part_index, record, windows * horizon):
                continue
        except OSError:  # unreadable now: recompute it (the write replaces it, or fails and is retried)
            continue
        try:
            path = outputs.part_path(output, name, part_index)
            table = storage.read_parquet(path, columns=["window_id", *columns])
        except (OSError, pa.ArrowException, KeyError):
            continue
        ids = table.column("window_id").to_numpy(zero_copy_only=False)[::horizon]
        values = np.stack([table.column(c).to_numpy() for c in columns], axis=1)
        found.values[name] = values.reshape(windows, horizon, len(columns))  # as written: rescoring is exact
        found.window_ids[name] = ids
    return found
