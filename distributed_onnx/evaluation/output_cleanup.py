"""The clean-up of a run directory before and during a run: what is not this run's results leaves ``forecasts/``.

``forecasts/`` is one dataset that readers take whole, and a resume trusts what it finds there: a killed run's
temporary files, a dropped checkpoint's forecasts, a stray file or a part about to be redone would otherwise be
read as this run's. Temporary files and a redone part's files are deleted; forecasts that may be all that is left
of something are moved to ``removed/``, never deleted. The paths are the layout's (:mod:`.outputs`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow.fs as pafs

from distributed_onnx import storage
from distributed_onnx.evaluation.outputs import (
    FORECASTS_DIR,
    MODEL_KEY,
    PARTIAL_PREFIX,
    REMOVED_DIR,
    SCORES_DIR,
    model_dir,
    part_path,
    sums_path,
)
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text

logger = logging.getLogger(__name__)


def clean_partials(output: Location, models: Sequence[str] = ()) -> None:
    """Remove temporary files a killed run left behind (they never got a final name; object stores have none)."""
    folders = [storage.join(output, SCORES_DIR), storage.join(output, FORECASTS_DIR)]
    folders += [model_dir(output, model) for model in models]
    for folder in folders:
        for path in storage.list_files(folder, PARTIAL_PREFIX, ""):
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
