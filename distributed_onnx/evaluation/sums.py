"""A part's metric sums: what the actor that computed a part writes (``scores/part-N.arrow``), what the driver merges.

One Arrow IPC file per part (plain arrays, never pickles; readable by any Arrow tool): a JSON header naming
the run, the part and every model of the run with its fingerprint, the :class:`~.scoring.pairs.PairScores`
of every model (checkpoints and baselines, on the part's common pairs), and the few forecast-fan candidates
the report draws (:mod:`.fans`). The sums of a part always cover every model of the run: a run to which a
checkpoint is added rescores the part for all models from the forecasts written before (the actor reads them
back) plus the newcomer's, so every model's sums stay on the same pairs. Sums merge exactly (they are sums), so the
driver builds ``metrics.parquet`` without reading a single forecast back; a resumed run merges the sums of the
parts done earlier with those done now and scores exactly as an uninterrupted run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.fans import FanCandidates
from distributed_onnx.evaluation.outputs import part_path, part_record, sums_path
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.location import Location
from distributed_onnx.model.window_batch import arrow_array, arrow_strings

#: Bumped whenever the file's layout changes; a file of another format is redone, not read.
SUMS_FORMAT = 4
SUMS_METADATA_KEY = b"distributed_onnx.sums"
#: The scope (and the sums' prefix) of the windows at or before a checkpoint's ``training_data_end``.
IN_SAMPLE = "in_sample"


@dataclass
class PartSums:
    """The sums of one part plus the header that ties them to their run and part."""

    header: dict[str, Any]
    scores: PairScores
    fans: FanCandidates
    #: The in-sample windows' sums (a checkpoint's ``training_data_end``), else None.
    in_sample: PairScores | None = None

    def to_bytes(self) -> bytes:
        arrays = {**self.scores.state("scores."), **self.fans.state("fans.")}
        if self.in_sample is not None:
            arrays |= self.in_sample.state(f"{IN_SAMPLE}.")
        # One row, one list column per array: the driver merging thousands of parts decodes a file in one
        # Arrow read (an .npz of the same arrays took several times longer a part to parse, when profiled).
        layout = {name: {"dtype": array.dtype.str, "shape": list(array.shape)} for name, array in arrays.items()}
        columns = {name: _list_of(array) for name, array in arrays.items()}
        document = {"header": {**self.header, "format": SUMS_FORMAT}, "arrays": layout}
        table = pa.table(columns).replace_schema_metadata({SUMS_METADATA_KEY: json.dumps(document, sort_keys=True)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    @classmethod
    def from_bytes(cls, payload: bytes) -> PartSums:
        """Parse a sums file; anything torn, foreign or of another format raises ``DataError``."""
        try:
            table = pa.ipc.open_file(pa.BufferReader(payload)).read_all()
            document = json.loads((table.schema.metadata or {})[SUMS_METADATA_KEY])
            header, layout = document["header"], document["arrays"]
            if not isinstance(header, dict) or header.get("format") != SUMS_FORMAT:
                raise DataError(f"sums file of another format: {header!r:.200}")
            arrays = {name: _array_of(table.column(name), spec) for name, spec in layout.items()}
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"unreadable sums file: {exc}") from exc
        in_sample = PairScores.from_state(arrays, f"{IN_SAMPLE}.") if f"{IN_SAMPLE}.models" in arrays else None
        scores = PairScores.from_state(arrays, "scores.")
        return cls(header, scores, FanCandidates.from_state(arrays, "fans."), in_sample)


def _list_of(array: np.ndarray) -> pa.ListArray:
    # From buffers: pyarrow's numpy conversions import pandas (paid in an actor's first part).
    flat = array.ravel()
    values = arrow_strings([str(item) for item in flat]) if array.dtype.kind == "U" else arrow_array(flat)
    return pa.ListArray.from_arrays(arrow_array(np.asarray([0, len(flat)], dtype=np.int32)), values)


def _array_of(column: pa.ChunkedArray, spec: dict[str, Any]) -> np.ndarray:
    values = column.chunk(0).values
    dtype = np.dtype(spec["dtype"])
    flat = np.asarray(values.to_pylist(), dtype=dtype) if dtype.kind == "U" else values.to_numpy()
    return np.asarray(flat, dtype=dtype).reshape(spec["shape"])


def write_sums(output: Location, part_index: int, sums: PartSums) -> int:
    return storage.write_bytes(sums_path(output, part_index), sums.to_bytes())


def model_part_verifies(output: Location, model: str, part_index: int, expected: dict[str, Any], rows: int) -> bool:
    """Whether a model's forecast part is readable and its footer names ``expected`` and holds ``rows`` rows."""
    found = part_record(output, model, part_index)
    if found is None:
        return False
    record, n_rows = found
    return n_rows == rows and all(record.get(key) == value for key, value in expected.items())


def read_done_part(
    output: Location,
    part_index: int,
    run_fingerprint: str,
    n_windows: int,
    horizon: int,
    models: dict[str, str],
) -> PartSums | None:
    """The sums of a part that is verifiably done for every model of ``models`` (name -> fingerprint), or None.

    Done means: the sums parse, name this run, this part, its window count and exactly these models with
    these fingerprints; each model's forecast part has a readable footer naming the same, holds
    ``n_windows * horizon`` rows and has the size the sums recorded. Only footers are read: verifying a
    finished run costs no forecast data.

    Absent or corrupt files are "not done" (the part is redone). A read the storage did not answer (any other
    ``OSError``) is retried with backoff, then raises :class:`~distributed_onnx.errors.StorageError`: "cannot
    tell now" must never read as "not done", since the caller then deletes files.
    """

    def verified() -> PartSums | None:
        try:
            sums = PartSums.from_bytes(storage.read_bytes(sums_path(output, part_index)))
        except DataError:
            return None
        header = sums.header
        expected = {"run_fingerprint": run_fingerprint, "part": part_index, "windows": n_windows}
        if any(header.get(key) != value for key, value in expected.items()) or header.get("models") != models:
            return None
        sizes = header.get("part_bytes") or {}
        for model, fingerprint in models.items():
            wanted = {**expected, "model_fingerprint": fingerprint}
            if not model_part_verifies(output, model, part_index, wanted, n_windows * horizon):
                return None
            if storage.file_size(part_path(output, model, part_index)) != sizes.get(model):
                return None
        return sums

    def read() -> PartSums | None:
        try:
            return verified()
        except FileNotFoundError:  # any file, at any step (a file removed between two reads included)
            return None

    return storage.read_retrying(read, f"part {part_index} of {output}")


def unverified_models(
    output: Location,
    part_index: int,
    run_fingerprint: str,
    n_windows: int,
    horizon: int,
    models: dict[str, str],
) -> list[str]:
    """The models whose forecast part of ``part_index`` certainly does not verify for this run (to delete).

    A part the storage cannot read now (an ``OSError`` other than a missing file) is not listed: "cannot tell"
    never leads to a deletion; the part's actor reads it again and recomputes it if it still cannot.
    """
    expected = {"run_fingerprint": run_fingerprint, "part": part_index, "windows": n_windows}
    rows = n_windows * horizon
    unverified = []
    for model, fingerprint in models.items():
        try:
            if not model_part_verifies(output, model, part_index, {**expected, "model_fingerprint": fingerprint}, rows):
                unverified.append(model)
        except FileNotFoundError:
            unverified.append(model)
        except OSError:
            continue
    return unverified
