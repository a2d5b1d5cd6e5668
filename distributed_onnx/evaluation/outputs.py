"""The backtest's run directory: forecast parts and their sums, the run manifest, and what counts as done.

``forecasts/model=NAME/part-NNNNNN.parquet`` holds part NNNNNN of the plan for checkpoint NAME, written by
the actor that computed it. ``forecasts/`` is one Hive-partitioned dataset that pandas, pyarrow.dataset,
polars and DuckDB read as it is, with ``model`` as a column; nothing else lives under it. The part's metric
sums, for every model of the run, are ``scores/part-NNNNNN.arrow`` (:mod:`.sums`), written after the
forecasts. The plan is deterministic, so a rerun with the same settings skips every part that is *verifiably*
done: every file present and readable, naming this run, this part and (forecasts) this model's fingerprint,
the row counts and sizes what the sums say. Anything else (a torn copy, a file from another run) is redone.
``run.json`` records the settings' fingerprint and the settings it digests (``fingerprinted``): a directory is
never resumed by a run with other settings, and refusing one names each setting that differs, with both values.
The directory may be a local path or a URL (``s3://...``): every file goes through :mod:`distributed_onnx.storage`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from distributed_onnx import names as path_names
from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, StorageError
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import quantile_column_name
from distributed_onnx.model.window_batch import arrow_array, flat_values, masked_floats, numpy_view
from distributed_onnx.redact import redact_text

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


def model_dir(output: Location, model: str) -> Location:
    """``forecasts/model=NAME``: ``NAME`` must be one file name (:mod:`distributed_onnx.names`), or a checked name's
    ``NAME@realized`` twin (``--compare-realized``: the run derives it, and ``@`` is safe in a file name)."""
    path_names.check(model.removesuffix(REALIZED_SUFFIX), what="model name")
    return storage.join(output, FORECASTS_DIR, f"{MODEL_KEY}={model}")


def part_path(output: Location, model: str, part_index: int) -> Location:
    return storage.join(model_dir(output, model), f"part-{part_index:06d}.parquet")


def sums_path(output: Location, part_index: int) -> Location:
    return storage.join(output, SCORES_DIR, f"part-{part_index:06d}.arrow")


def has_scored_parts(output: Location) -> bool:
    """Whether any part of a run has written its scores here (a rerun, perhaps with nothing left to do)."""
    return bool(storage.list_files(storage.join(output, SCORES_DIR), "part-", ".arrow"))


#: The key of ``run.json`` that holds what the fingerprint digests (the plan's ``fingerprinted``).
FINGERPRINTED_KEY = "fingerprinted"


def prepare_output(output: Location, fingerprint: str, manifest: dict[str, Any]) -> None:
    """Create the directory, or check that the existing one belongs to the same run.

    ``manifest[FINGERPRINTED_KEY]``, when given, is what ``fingerprint`` digests: another run's folder is refused
    naming each of those settings that differs, with both values (a folder written before they were recorded:
    each differing setting of the recorded ``settings``)."""
    _make_run_directory(output)
    path = storage.join(output, MANIFEST)
    check_run_folder(output)
    if storage.is_file(path):
        previous = _manifest_fingerprint(path)
        if previous != fingerprint:
            differences = _setting_differences(_read_manifest(path), manifest)
            raise ConfigError(
                f"{output} holds a backtest with other settings ({differences}; fingerprint {previous}, this run "
                f"{fingerprint}); use another --output directory, rerun with the recorded settings, or delete that "
                "one.",
                key="output",
            )
        return
    document = storage.redacted({"fingerprint": fingerprint, **manifest})  # a URL's secrets stay in the URL
    storage.write_bytes(path, json.dumps(document, indent=2, default=str).encode())


def check_output_folder(output: Location) -> None:
    """Refuse an output that is an existing file, or a link to a folder that does not exist (exit 2): a run's
    output is a folder, new or one it wrote. Asked before Ray starts (``evaluation/up_front.py``) and again when
    the folder is made."""
    if storage.is_file(output):
        raise ConfigError(f"--output {output} is a file; give a directory (new, or one this run wrote).", key="output")
    local = output.local_path
    if local is not None and local.is_symlink() and not local.exists():
        raise ConfigError(
            f"--output {output} is a symbolic link to {os.readlink(local)}, which does not exist; make that folder, "
            "or give another --output.",
            key="output",
        )


#: The run's lock (:mod:`.run_lock`): in the run directory, never a file a folder without a run record is refused for.
LOCK = "run.lock"
#: Where the Python API writes a run's in-memory data (``distributed_onnx/api.py``) before the run starts.
INPUTS_DIR = "inputs"
#: Prefix of a file being written (:mod:`distributed_onnx.storage`), left behind only by a killed process.
PARTIAL_PREFIX = ".tmp-"


def check_run_folder(output: Location) -> None:
    """Refuse (exit 2) a folder that holds files but no ``run.json``: not a run of this project, or one whose
    record was deleted. Writing into it would overwrite its files (``metrics.parquet``) and leave others inside
    the run's ``forecasts/`` dataset (an older run's parts, anything else), read back as this run's."""
    check_own_folder(output, "A backtest", record=MANIFEST, own=(LOCK, INPUTS_DIR))


def check_own_folder(output: Location, command: str, *, record: str | None, own: Sequence[str]) -> None:
    """Refuse (exit 2) an existing ``output`` folder that holds files not of ``command``'s making, naming them.

    A folder holding ``record`` (its run record) is the command's own, whatever else is in it. Otherwise every
    file must sit under one of the ``own`` top-level entries (what the command writes, or may find there): a
    rerun rewrites those, and would overwrite or mix with anything else. Files being written (``.tmp-``, a killed
    run's) are not counted. One check for ``backtest`` (``record`` its ``run.json``) and ``score`` (no record: its
    own entries)."""
    if (record is not None and storage.is_file(storage.join(output, record))) or not storage.is_dir(output):
        return
    fs, base = storage.filesystem(output)
    listed = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    found = sorted(info.path[len(base) :].lstrip("/") for info in listed if info.type == pafs.FileType.File)
    found = [
        name
        for name in found
        if name.split("/")[0] not in own and not name.rsplit("/", 1)[-1].startswith(PARTIAL_PREFIX)
    ]
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        held = f"but no run record ({record})" if record is not None else f"that {command.lower()} does not write"
        raise ConfigError(
            f"--output {output} holds {len(found)} file(s) {held}: {shown}. {command} writes into a new or empty "
            "folder, or one holding its own output: give another --output, or move those files out of it.",
            key="output",
        )


#: The folders a backtest writes in its run directory, and the files it writes there at fixed names.
RUN_FOLDERS = (FORECASTS_DIR, SCORES_DIR, REMOVED_DIR)
RUN_FILES = (MANIFEST, METRICS, LEADERBOARD, "summary.json", "report.html", "failed_windows.json", LOCK)


def check_run_entries(output: Location) -> None:
    """Refuse (exit 2) a local run folder the run cannot write into, naming what is in the way and what to do.

    Each was an I/O error (exit 3) advising a rerun that could never succeed: a folder that cannot be written
    (read-only, no permission), a file (or a link to nothing) where the run makes a folder (``removed``), a
    folder where it writes a file (``run.lock``). Cheap: a few ``lstat`` calls, asked before Ray starts."""
    folder = output.local_path
    if folder is None or not folder.is_dir():
        return
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--output {output} cannot be written (read-only, or no permission); make it writable, or give "
            "another --output.",
            key="output",
        )
    for name in RUN_FOLDERS:
        entry = folder / name
        if os.path.lexists(entry) and not entry.is_dir():
            raise ConfigError(
                f"{entry} is in the way: the run makes a folder there, and it is {_entry_kind(entry)}. Move it out "
                "of the run folder and rerun.",
                key="output",
            )
        if entry.is_dir() and not os.access(entry, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{entry} cannot be written (read-only, or no permission); make it writable.", key="output"
            )
    for name in RUN_FILES:
        entry = folder / name
        if entry.is_dir():
            raise ConfigError(
                f"{entry} is in the way: the run writes a file there, and it is {_entry_kind(entry)}. Move it out "
                "of the run folder and rerun.",
                key="output",
            )


def _entry_kind(entry: Path) -> str:
    """What ``entry`` is, in words: a link (and to what), a folder, a file, something else."""
    if entry.is_symlink():
        target = os.readlink(entry)
        return f"a symbolic link to {target}" + ("" if entry.exists() else ", which does not exist")
    if entry.is_dir():
        return "a folder"
    return "a file" if entry.is_file() else "not a regular file"


def _make_run_directory(output: Location) -> None:
    """Create ``output/forecasts``; a path that names a file, or that cannot be created, is a setting to fix."""
    check_output_folder(output)
    try:
        storage.make_dirs(storage.join(output, FORECASTS_DIR))
        storage.make_dirs(storage.join(output, SCORES_DIR))
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:
        raise ConfigError(f"Cannot create the run directory {output}: {exc}", key="output") from exc
    except OSError as exc:
        raise StorageError(f"Cannot create the run directory {output}: {exc}", path=str(output)) from exc


def _read_manifest(path: Location) -> dict[str, Any]:
    document = json.loads(storage.read_retrying(lambda: storage.read_bytes(path), str(path)).decode("utf-8"))
    return document if isinstance(document, dict) else {}


def _setting_differences(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """Each setting the two manifests' fingerprinted settings (else their ``settings``) differ in, both values."""
    from distributed_onnx.model.identity import Difference, describe_differences

    key = FINGERPRINTED_KEY if isinstance(recorded.get(FINGERPRINTED_KEY), dict) else "settings"
    before, now = _flat(recorded.get(key)), _flat(current.get(key))
    if key == "settings":  # the folder itself is the same; only what it was computed with is compared
        before.pop("output", None)
        now.pop("output", None)
    differences = [
        Difference(name, before.get(name, "(not set)"), now.get(name, "(not set)"))
        for name in sorted(before.keys() | now.keys())
        if before.get(name) != now.get(name)
    ]
    if not differences:
        return "which settings differ is not recorded there"
    return describe_differences(differences, "recorded", "this run", limit=8)


def _flat(document: Any) -> dict[str, Any]:
    """``{"spec": {"stride": 2}}`` as ``{"stride": 2}``: a nested setting by its own name, unless the top level
    already holds that name (the spec's ``horizon`` is the run's ``horizon``)."""
    if not isinstance(document, dict):
        return {}
    top = {name: value for name, value in document.items() if not isinstance(value, dict)}
    for value in document.values():
        if isinstance(value, dict):
            top |= {name: inner for name, inner in value.items() if name not in document}
    return json.loads(json.dumps(top, default=str))  # as run.json holds them: tuples as lists, paths as text


def _manifest_fingerprint(path: Location) -> Any:
    """The fingerprint a ``run.json`` records; a file that is not a manifest is refused, naming it."""
    payload = storage.read_retrying(lambda: storage.read_bytes(path), str(path))
    try:
        document = json.loads(payload.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, or not JSON
        document, problem = None, f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    else:
        kind = "object without one" if isinstance(document, dict) else type(document).__name__
        problem = f"a JSON {kind}"
    if not isinstance(document, dict) or "fingerprint" not in document:
        raise ConfigError(
            f"{path} is not a backtest manifest (expected a JSON object with a 'fingerprint', found {problem:.200}); "
            "the folder's files cannot be told to be a run's: use another --output directory.",
            key="output",
        )
    return document["fingerprint"]


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


def clean_partials(output: Location, models: Sequence[str] = ()) -> None:
    """Remove temporary files a killed run left behind (they never got a final name; object stores have none)."""
    folders = [storage.join(output, SCORES_DIR), storage.join(output, FORECASTS_DIR)]
    folders += [model_dir(output, model) for model in models]
    for folder in folders:
        for path in storage.list_files(folder, ".tmp-", ""):
            storage.delete(path)


def set_aside_removed_models(output: Location, models: Sequence[str]) -> list[str]:
    """Move ``forecasts/model=X/`` of every ``X`` not among ``models`` to ``removed/model=X/``; the names moved.

    ``forecasts/`` is one dataset that readers take whole (``pd.read_parquet("DIR/forecasts")``): a checkpoint
    dropped from the run's ``--checkpoint`` list would otherwise stay in it, a model the run no longer has.
    Moved, not deleted (its forecasts may be all that is left of it); adding the checkpoint back recomputes it.
    """
    fs, base = storage.filesystem(storage.join(output, FORECASTS_DIR))
    _, removed = storage.filesystem(storage.join(output, REMOVED_DIR))
    kept = {f"{MODEL_KEY}={model}" for model in models}
    listed = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    found = sorted(info.base_name for info in listed if info.type == pafs.FileType.Directory)
    moved = []
    for name in found:
        if not name.startswith(f"{MODEL_KEY}=") or name in kept:
            continue
        source, target = f"{base}/{name}", f"{removed}/{name}"
        fs.create_dir(removed, recursive=True)
        target = _free_name(fs, target)  # set aside before: both kept, this one under a numbered name
        if isinstance(fs, pafs.LocalFileSystem):
            fs.move(source, target)
        else:  # object stores move objects, not folders
            for info in fs.get_file_info(pafs.FileSelector(source, recursive=True)):
                if info.type == pafs.FileType.File:
                    fs.move(info.path, target + info.path[len(source) :])
            fs.delete_dir(source)
        target_location = storage.join(output, REMOVED_DIR, target[len(removed) :].lstrip("/"))
        moved.append(name.removeprefix(f"{MODEL_KEY}="))
        logger.warning(
            "Checkpoint %r is no longer in this run: its forecasts moved out of forecasts/ to %s",
            moved[-1],
            str(target_location),
        )
    return moved


def set_aside_foreign_forecasts(output: Location, models: Sequence[str], n_parts: int) -> list[str]:
    """Move every file under ``forecasts/`` that is not one of this plan's parts (``model=M/part-N.parquet``,
    ``M`` a model of the run, ``N`` below ``n_parts``) to the same place under ``removed/``; the files moved.

    ``forecasts/`` is one dataset that readers take whole: a stray file there (a part of a longer plan, notes)
    would be read as this run's forecasts. Moved with a warning, not deleted. Removed models' folders are moved
    whole before (:func:`set_aside_removed_models`); partial files are cleaned (:func:`clean_partials`).
    """
    fs, base = storage.filesystem(storage.join(output, FORECASTS_DIR))
    _, removed = storage.filesystem(storage.join(output, REMOVED_DIR))
    kept = {f"{MODEL_KEY}={model}/part-{index:06d}.parquet" for model in models for index in range(n_parts)}
    listed = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    stray = sorted(
        info.path[len(base) :].lstrip("/")
        for info in listed
        if info.type == pafs.FileType.File and info.path[len(base) :].lstrip("/") not in kept
    )
    for name in stray:
        target = f"{removed}/{name}"
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        fs.move(f"{base}/{name}", _free_name(fs, target))
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        logger.warning(
            "%d file(s) in forecasts/ are not this run's parts: moved to %s (%s)",
            len(stray),
            str(storage.join(output, REMOVED_DIR)),
            shown,
        )
    return stray


def _free_name(fs: pafs.FileSystem, target: str) -> str:
    """``target``, or when something is there already (set aside by an earlier run) the first free
    ``NAME.N.SUFFIX`` beside it (``README.1``, ``part-000003.1.parquet``, ``model=x.1``): ``removed/`` keeps
    everything it was given, never overwritten."""
    if fs.get_file_info(target).type == pafs.FileType.NotFound:
        return target
    folder, _, name = target.rpartition("/")
    stem, dot, suffix = name.partition(".") if not name.startswith(f"{MODEL_KEY}=") else (name, "", "")
    number = 1
    while True:
        candidate = f"{folder}/{stem}.{number}{dot}{suffix}"
        if fs.get_file_info(candidate).type == pafs.FileType.NotFound:
            return candidate
        number += 1


def discard_part(output: Location, part_index: int, models: Sequence[str] = ()) -> None:
    """Delete a part's sums and the given models' forecasts, so no reader can mistake them for results.

    A file that cannot be deleted is left for the part's rerun to replace (or to fail on, recorded).
    """
    for path in (sums_path(output, part_index), *(part_path(output, model, part_index) for model in models)):
        try:
            storage.delete(path)
        except OSError as exc:
            logger.warning("Cannot remove %s before redoing part %d: %s", str(path), part_index, redact_text(str(exc)))
