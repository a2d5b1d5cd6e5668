"""The backtest's run directory: where each file lives, and the forecast parts and vintage counts written there.

``forecasts/model=NAME/part-NNNNNN.parquet`` holds part NNNNNN of the plan for checkpoint NAME, written by
the actor that computed it. ``forecasts/`` is one Hive-partitioned dataset that pandas, pyarrow.dataset,
polars and DuckDB read as it is, with ``model`` as a column; nothing else lives under it. The part's metric
sums, for every model of the run, are ``scores/part-NNNNNN.arrow`` (:mod:`.sums`), written after the
forecasts. The plan is deterministic, so a rerun with the same settings skips every part that is *verifiably*
done: every file present and readable, naming this run, this part and (forecasts) this model's fingerprint,
the row counts and sizes what the sums say. Anything else (a torn copy, a file from another run) is redone.
The directory may be a local path or a URL (``s3://...``): every file goes through :mod:`distributed_onnx.storage`.

This module is the one definition of the layout (names, paths) and of the part files; what else a run does with
the folder reads the layout from here: the checks of an output folder before a run (:mod:`.output_checks`), the
run's record ``run.json`` (:mod:`.run_manifest`), the clean-up of what is not this run's (:mod:`.output_cleanup`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import names as path_names
from distributed_onnx import storage
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import quantile_column_name
from distributed_onnx.model.window_batch import arrow_array, flat_values, masked_floats, numpy_view

logger = logging.getLogger(__name__)

FORECASTS_DIR = "forecasts"
SCORES_DIR = "scores"
#: Where what leaves ``forecasts/`` is moved (a dropped checkpoint's forecasts, stray files): out of the dataset, kept.
REMOVED_DIR = "removed"
MANIFEST = "run.json"
#: The run's merged metrics and its leaderboard, written by the driver's merge, read by the report and ``score``.
METRICS = "metrics.parquet"
LEADERBOARD = "leaderboard.parquet"
#: Hive partition key of the forecasts dataset.
MODEL_KEY = "model"
#: Key of the part's own record in its Parquet footer (run fingerprint, part index, windows, writer node).
PART_METADATA_KEY = b"distributed_onnx.part"
#: The run's lock (:mod:`.run_lock`): in the run directory, never a file a folder without a run record is refused for.
LOCK = "run.lock"
#: Where the Python API writes a run's in-memory data (``distributed_onnx/api.py``) before the run starts.
INPUTS_DIR = "inputs"
#: Prefix of a file being written (:mod:`distributed_onnx.storage`), left behind only by a killed process.
PARTIAL_PREFIX = ".tmp-"
#: The folders a backtest writes in its run directory, and the files it writes there at fixed names.
RUN_FOLDERS = (FORECASTS_DIR, SCORES_DIR, REMOVED_DIR)
SUMMARY = "summary.json"
#: Which windows the latest invocation could not forecast (removed once every window is done).
FAILED_WINDOWS = "failed_windows.json"
#: Per model, the windows holding NaN or infinite forecasts (removed once none are).
NONFINITE_WINDOWS = "nonfinite_windows.json"
#: Per covariate and lead, the age of the vintaged values the models saw (joins ``metrics.parquet`` on ``lead``).
COVARIATE_AGES = "covariate_ages.parquet"
RUN_FILES = (MANIFEST, METRICS, LEADERBOARD, SUMMARY, "report.html", FAILED_WINDOWS, LOCK)
#: A part's metric sums in ``scores/`` are ``part-NNNNNN.arrow`` (:func:`sums_path`): any there says a run in this
#: folder has scored parts (:func:`has_scored_parts`; the output's one look before a run, :mod:`.output_checks`).
SUMS_PREFIX = "part-"
SUMS_SUFFIX = ".arrow"


def model_dir(output: Location, model: str) -> Location:
    """``forecasts/model=NAME``: ``NAME`` must be one file name (:mod:`distributed_onnx.names`), or a checked name's
    ``NAME@realized`` twin (``--compare-realized``: the run derives it, and ``@`` is safe in a file name)."""
    path_names.check(model.removesuffix(REALIZED_SUFFIX), what="model name")
    return storage.join(output, FORECASTS_DIR, f"{MODEL_KEY}={model}")


def part_path(output: Location, model: str, part_index: int) -> Location:
    return storage.join(model_dir(output, model), f"part-{part_index:06d}.parquet")


def sums_path(output: Location, part_index: int) -> Location:
    return storage.join(output, SCORES_DIR, f"{SUMS_PREFIX}{part_index:06d}{SUMS_SUFFIX}")


def has_scored_parts(output: Location) -> bool:
    """Whether any part of a run has written its scores here (a rerun, perhaps with nothing left to do)."""
    return bool(storage.list_files(output / SCORES_DIR, SUMS_PREFIX, SUMS_SUFFIX))


def forecast_table(batch: pa.RecordBatch, forecasts: np.ndarray, quantiles: Sequence[float], step_us: int) -> pa.Table:
    """One row per (window, lead) from a model batch and its ``[W, H, Q]`` forecasts."""
    n_windows, horizon, _ = forecasts.shape
    if n_windows != batch.num_rows:
        raise ValueError(f"batch has {batch.num_rows} windows but {n_windows} forecasts came back")
    # Numeric columns from their buffers: pyarrow's numpy conversions import pandas (see window_batch).
    repeat = arrow_array(np.repeat(np.arange(n_windows, dtype=np.int64), horizon))
    timestamp_type = batch.schema.field("origin").type
    origin_us = np.repeat(numpy_view(batch.column("origin")).view(np.int64), horizon)
    lead = np.tile(np.arange(1, horizon + 1, dtype=np.int32), n_windows)
    target = flat_values(batch.column("target"))
    columns: dict[str, pa.Array] = {
        "series_id": pc.take(batch.column("series_id"), repeat),
        "window_id": pc.take(batch.column("window_id"), repeat),
        "origin": arrow_array(origin_us, timestamp_type),
        "cutoff": arrow_array(origin_us - step_us, timestamp_type),
        "timestamp": arrow_array(origin_us + (lead.astype(np.int64) - 1) * step_us, timestamp_type),
        "lead": arrow_array(lead),
        "y": masked_floats(target),
    }
    flat = forecasts.reshape(n_windows * horizon, -1)
    for position, level in enumerate(quantiles):
        columns[quantile_column_name(level)] = arrow_array(flat[:, position])
    return pa.Table.from_pydict(columns)


def write_part(output: Location, model: str, part_index: int, table: pa.Table, record: dict[str, Any]) -> int:
    """Write one part atomically and durably, its ``record`` in the footer; returns the file's bytes."""
    metadata = {**(table.schema.metadata or {}), PART_METADATA_KEY: json.dumps(record, sort_keys=True).encode()}
    # Profiled on reference forecasts: dictionary-encoding the float columns (which never repeat) slowed the
    # writes, so only the id columns get dictionaries; lz4 wrote faster than zstd, for somewhat larger files.
    storage.make_dirs(model_dir(output, model))
    return storage.write_parquet(
        part_path(output, model, part_index),
        table.replace_schema_metadata(metadata),
        compression="lz4",
        use_dictionary=["series_id", "window_id"],
    )


def part_record(output: Location, model: str, part_index: int) -> tuple[dict[str, Any], int] | None:
    """The record in a part's footer and its row count, or None when the file is absent or corrupt.

    Any other ``OSError`` (the storage did not answer: an S3 SlowDown, an NFS EIO) is raised, not taken for a
    corrupt file: a resume deletes what is not done, and a good part must not be deleted for a flaky read.
    """
    path = part_path(output, model, part_index)
    try:
        footer = storage.read_parquet_metadata(path)
    except FileNotFoundError:
        return None
    except (ValueError, pa.ArrowInvalid) as exc:  # torn or not Parquet (ArrowInvalid is a ValueError)
        logger.debug("Part %d's footer is unreadable: %s", part_index, exc)
        return None
    try:
        raw = (footer.metadata or {}).get(PART_METADATA_KEY)
        record = json.loads(raw) if raw else {}
    except ValueError:
        return None
    return (record if isinstance(record, dict) else {}), int(footer.num_rows)


#: A part's vintage counts (:class:`~.data.vintages.VintageStats`), beside its sums: ``scores/vintages-N.json``.
VINTAGES_PREFIX = "vintages-"


def vintage_stats_path(output: Location, part_index: int) -> Location:
    return storage.join(output, SCORES_DIR, f"{VINTAGES_PREFIX}{part_index:06d}.json")


def write_vintage_stats(output: Location, part_index: int, document: dict[str, Any]) -> int:
    return storage.write_bytes(vintage_stats_path(output, part_index), json.dumps(document).encode())


def read_vintage_stats(output: Location, part_index: int) -> dict[str, Any] | None:
    """A part's vintage counts, or None when the part has none (written before, or torn)."""
    path = vintage_stats_path(output, part_index)
    if not storage.is_file(path):
        return None
    try:
        document = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


@dataclass(frozen=True)
class EarlierFiles:
    """What the run folder holds of earlier work once the run's parts are done, read once for the report stage:
    the ``summary.json`` an earlier invocation of this same run left (its record of who computed the parts, kept
    by a rerun), the vintage counts of the parts done (in part order), and whether an earlier invocation left
    ``failed_windows.json``."""

    summary: dict[str, Any] | None
    vintage_documents: list[dict[str, Any]]
    failed_windows: bool


@dataclass(frozen=True)
class RunRecord:
    """What the report stage writes last, in this order: ``covariate_ages.parquet`` (when covariates were vintaged),
    ``nonfinite_windows.json`` (removed when every forecast was finite), ``summary.json``, and
    ``failed_windows.json`` (when parts failed; else an earlier invocation's is removed first: every window is done).
    """

    summary: dict[str, Any]
    covariate_ages: pa.Table | None
    nonfinite_windows: dict[str, list[str]]
    failed_windows: list[dict[str, Any]]
    #: An earlier invocation's failed_windows.json to remove (:attr:`EarlierFiles.failed_windows`).
    stale_failed_windows: bool


@dataclass(frozen=True)
class RunFolder:
    """A run directory's reads and writes of the run's own files after its parts: the one owner of those files.

    The report stage is handed this once (made from ``settings.output``): it reads what the parts and earlier
    invocations left (:meth:`earlier_files`) and writes what the run concluded (:meth:`write_record`), rather than
    taking the bare location to :mod:`distributed_onnx.storage` from each of its steps."""

    location: Location

    def path(self, name: str) -> Location:
        """The file ``name`` of the run directory (one of the names above)."""
        return self.location / name

    def earlier_files(self, run_fingerprint: str, vintaged_parts: Iterable[int]) -> EarlierFiles:
        """The ``summary.json`` an earlier invocation of this same run left, if readable; the vintage counts
        ``vintaged_parts`` wrote, in part order (a part without its file, or a torn one, has none); and whether
        ``failed_windows.json`` is there."""
        found = (read_vintage_stats(self.location, index) for index in sorted(vintaged_parts))
        documents = [document for document in found if document is not None]
        return EarlierFiles(
            self._previous_summary(run_fingerprint), documents, storage.is_file(self.path(FAILED_WINDOWS))
        )

    def _previous_summary(self, run_fingerprint: str) -> dict[str, Any] | None:
        path = self.path(SUMMARY)
        try:
            document = json.loads(storage.read_bytes(path)) if storage.is_file(path) else None
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) and document.get("run_fingerprint") == run_fingerprint else None

    def write_leaderboard(self, table: pa.Table) -> None:
        """Write ``leaderboard.parquet`` (by the driver, or by the report process: :mod:`.driver.report_process`)."""
        storage.write_parquet(self.path(LEADERBOARD), table)

    def write_record(self, record: RunRecord) -> None:
        """Write (and remove) the files of :class:`RunRecord`, in its order: ``summary.json`` the last but for the
        failed windows' ids."""
        if record.covariate_ages is not None:
            storage.write_parquet(self.path(COVARIATE_AGES), record.covariate_ages)
        nonfinite = self.path(NONFINITE_WINDOWS)
        if record.nonfinite_windows:
            storage.write_bytes(nonfinite, json.dumps(record.nonfinite_windows, indent=2).encode())
        elif storage.is_file(nonfinite):
            storage.delete(nonfinite)
        if record.stale_failed_windows and not record.failed_windows:
            storage.delete(self.path(FAILED_WINDOWS))
        storage.write_bytes(self.path(SUMMARY), json.dumps(record.summary, indent=2, default=str).encode())
        if record.failed_windows:
            storage.write_bytes(self.path(FAILED_WINDOWS), json.dumps(record.failed_windows, indent=2).encode())
