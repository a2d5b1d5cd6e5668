"""A part's metric sums: what the actor that computed a part writes beside it, and what the driver merges.

One ``.npz`` file (plain arrays, never pickles) per part: a JSON header naming the run and the part, the
model's and the seasonal-naive baseline's :class:`~distributed_onnx.metrics.MetricsAccumulator` sums, and the
few forecast-fan candidates the report draws (:mod:`.fans`). Sums merge exactly (they are sums), so the
driver builds ``metrics.parquet`` without reading a single forecast back; a resumed run merges the sums of the
parts done earlier with those done now and scores exactly as an uninterrupted run.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from distributed_onnx import storage
from distributed_onnx.backtest.fans import FanCandidates
from distributed_onnx.backtest.outputs import part_path, part_record, sums_path
from distributed_onnx.errors import DataError
from distributed_onnx.metrics import MetricsAccumulator

#: Bumped whenever the file's layout changes; a file of another format is redone, not read.
SUMS_FORMAT = 1


@dataclass
class PartSums:
    """The sums of one part plus the header that ties them to their run and part."""

    header: dict[str, Any]
    model: MetricsAccumulator
    naive: MetricsAccumulator
    fans: FanCandidates

    def to_bytes(self) -> bytes:
        arrays = {
            "header": np.asarray(json.dumps({**self.header, "format": SUMS_FORMAT}, sort_keys=True)),
            **self.model.state("model."),
            **self.naive.state("naive."),
            **self.fans.state("fans."),
        }
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> PartSums:
        """Parse a sums file; anything torn, foreign or of another format raises ``DataError``."""
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
            header = json.loads(str(arrays["header"]))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"unreadable sums file: {exc}") from exc
        if not isinstance(header, dict) or header.get("format") != SUMS_FORMAT:
            raise DataError(f"sums file of another format: {header!r:.200}")
        return cls(
            header,
            MetricsAccumulator.from_state(arrays, "model."),
            MetricsAccumulator.from_state(arrays, "naive."),
            FanCandidates.from_state(arrays, "fans."),
        )


def write_sums(output: storage.Location, part_index: int, sums: PartSums) -> int:
    return storage.write_bytes(sums_path(output, part_index), sums.to_bytes())


def read_done_part(
    output: storage.Location, part_index: int, run_fingerprint: str, n_windows: int, horizon: int
) -> PartSums | None:
    """The sums of a part that is verifiably done, or None (absent, torn, foreign, or disagreeing files).

    Done means: the sums parse and name this run, this part and its window count; the forecast part's footer
    is readable, names the same run and part, and holds ``n_windows * horizon`` rows of exactly the size the
    sums recorded. Only footers are read: verifying a finished run costs no forecast data.
    """
    try:
        sums = PartSums.from_bytes(storage.read_bytes(sums_path(output, part_index)))
    except (OSError, DataError):
        return None
    header = sums.header
    expected = {"run_fingerprint": run_fingerprint, "part": part_index, "windows": n_windows}
    if any(header.get(key) != value for key, value in expected.items()):
        return None
    found = part_record(output, part_index)
    if found is None:
        return None
    record, rows = found
    if any(record.get(key) != value for key, value in expected.items()) or rows != n_windows * horizon:
        return None
    if storage.file_size(part_path(output, part_index)) != header.get("part_bytes"):
        return None
    return sums
