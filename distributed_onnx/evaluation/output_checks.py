"""The checks of a run's output folder before anything is written there: each refusal is a setting to fix (exit 2).

A folder that cannot hold the run (a file, a link to nothing, read-only, an entry where the run writes) or that
holds someone else's files would otherwise fail as an I/O error (exit 3) advising a rerun that cannot succeed, or
be written into, mixing the run's files with others. Asked before Ray starts (:mod:`.up_front`, which looks at the
folder once: :func:`look_at_output`), and again under the run's lock (:mod:`.run_lock`) when the run makes its
folder (:mod:`.run_manifest`); ``score`` and ``fev`` ask the ones that fit their folders. The names checked are the
layout's (:mod:`.outputs`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.outputs import (
    INPUTS_DIR,
    LOCK,
    MANIFEST,
    PARTIAL_PREFIX,
    RUN_FILES,
    RUN_FOLDERS,
    SCORES_DIR,
    SUMS_PREFIX,
    SUMS_SUFFIX,
)
from distributed_onnx.local_paths import name_too_long, not_a_file
from distributed_onnx.location import Location
from distributed_onnx.writable import unwritable_problem

#: The top-level entries of a backtest's folder that are its own before its run record exists.
RUN_OWN = (LOCK, INPUTS_DIR)


def check_run_output(output: Location) -> FoundAtOutput:
    """Every check of a backtest's output before Ray starts (exit 2 on the first found), in the order a user meets
    them: an output the run's actors can reach (:func:`check_output_reachable`), a folder and not a file
    (:func:`check_output_folder`), no one else's files in it (:func:`check_run_folder`: refused now, and again under
    the run's lock), nothing in the way of what the run writes there (:func:`check_run_entries`: a read-only folder,
    an entry in the way: refused now, and again under the run's lock, not an I/O error later). What the folder holds
    is looked at once (:func:`look_at_output`) for the checks that read it, and returned: the early start reads
    from it whether the run is a rerun (:func:`~.driver.early.start_early`)."""
    check_output_reachable(output)
    found = look_at_output(output, record=MANIFEST, own=RUN_OWN)
    _refuse_a_file(output, found.is_file)
    _refuse_others_files(output, "A backtest", MANIFEST, found.others)
    check_run_entries(output)
    return found


@dataclass(frozen=True)
class FoundAtOutput:
    """What an output holds before anything is written there, looked at once (:func:`look_at_output`)."""

    #: Whether the output is an existing file (a run's output is a folder).
    is_file: bool
    #: The files (relative paths) of an existing folder that are not the command's: none when it is new, holds its
    #: run record, or holds only the command's own entries and partial writes.
    others: tuple[str, ...]
    #: Whether the folder holds its run record and a part's metric sums (``scores/part-*.arrow``): a rerun, which
    #: may find every part done (the early start starts no Ray for it).
    has_scored_parts: bool = False


def look_at_output(output: Location, *, record: str | None, own: Sequence[str]) -> FoundAtOutput:
    """Every question the checks ask the storage about ``output``, asked in one place. A folder holding ``record``
    (its run record) is the command's own, whatever else is in it: only its ``scores/`` is listed, for whether a
    part has scored there (:data:`~.outputs.SUMS_PREFIX`); otherwise every file must sit under one of the ``own``
    top-level entries (what the command writes, or may find there). Files being written (``.tmp-``, a killed
    run's) are not counted."""
    if storage.is_file(output):
        return FoundAtOutput(is_file=True, others=())
    has_record = record is not None and storage.is_file(storage.join(output, record))
    if not has_record and not storage.is_dir(output):
        return FoundAtOutput(is_file=False, others=())
    local = output.local_path
    if not has_record and local is not None and local.resolve() == Path(local.resolve().anchor):
        # file:// is the root too: listing it walked /proc's loops to a PermissionError (exit 3) on a 700-byte line
        raise ConfigError(f"--output {output} is the file system's root; give a folder in it.", key="output")
    fs, base = storage.filesystem(output)
    if has_record:
        return FoundAtOutput(is_file=False, others=(), has_scored_parts=_has_sums(fs, base))
    try:
        listed = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as exc:  # a folder holding what this user cannot list is not the command's own
        raise ConfigError(
            f"--output {output} holds entries that cannot be listed ({type(exc).__name__}); give a new folder, "
            "or one this command wrote.",
            key="output",
        ) from None
    found = sorted(info.path[len(base) :].lstrip("/") for info in listed if info.type == pafs.FileType.File)
    others = tuple(
        name
        for name in found
        if name.split("/")[0] not in own and not name.rsplit("/", 1)[-1].startswith(PARTIAL_PREFIX)
    )
    return FoundAtOutput(is_file=False, others=others)


def _has_sums(fs: pafs.FileSystem, base: str) -> bool:
    """Whether the run folder at ``base`` holds a part's metric sums (``scores/part-*.arrow``). A ``scores/`` that
    cannot be listed counts as none: the answer only decides whether Ray starts before the plan, and a resume
    reads ``scores/`` itself, naming what it cannot read."""
    try:
        listed = fs.get_file_info(pafs.FileSelector(f"{base.rstrip('/')}/{SCORES_DIR}", allow_not_found=True))
    except OSError:
        return False
    return any(
        info.type == pafs.FileType.File
        and info.base_name.startswith(SUMS_PREFIX)
        and info.base_name.endswith(SUMS_SUFFIX)
        for info in listed
    )


def check_output_folder(output: Location) -> None:
    """Refuse an output that is an existing file, or a link to a folder that does not exist (exit 2): a run's
    output is a folder, new or one it wrote. Asked before Ray starts (``evaluation/up_front.py``) and again when
    the folder is made."""
    _refuse_a_file(output, storage.is_file(output))


def _refuse_a_file(output: Location, is_file: bool) -> None:
    """:func:`check_output_folder`'s refusals, told whether the output is a file."""
    if is_file:
        raise ConfigError(f"--output {output} is a file; give a directory (new, or one this run wrote).", key="output")
    local = output.local_path
    if local is not None and local.is_symlink() and not local.exists():
        there = not_a_file(local)  # a link to nothing, or in a loop of links (local_paths: the words of both)
        fix = "make that folder" if there is not None and there.endswith("does not exist") else "remove the link"
        raise ConfigError(f"--output {output} {there}; {fix}, or give another --output.", key="output")


def check_output_reachable(output: Location, *, what: str = "folder") -> None:
    """Refuse (exit 2), before Ray starts or anything is measured, an output the command could not write to or a
    later command read: what :func:`~distributed_onnx.writable.unwritable_problem` says of it (``ftp://``,
    ``-``, ``memory://``, an ``http(s)://`` server...; the rule serve's ``--forecast-log`` reads too), and a local
    path too long for its file system. ``what`` the output is (``folder``, or ``file`` for ``tune``), for the
    message. The one home of these checks for a command's ``--output``:
    asked by the backtest's up-front checks, the fev runner, ``score`` and ``tune``; a process that writes its own
    run folder (a test, :func:`~.run_manifest.prepare_output`) may keep one in ``memory://``."""
    problem = unwritable_problem(output, what)  # the one rule of every output (writable.py), serve's log's too
    if problem is not None:
        raise ConfigError(f"--output {problem}.", key="output")
    if output.local_path is not None:
        _refuse_a_name_too_long(output, output.local_path)
        _refuse_a_path_too_long(output, output.local_path)


def _refuse_a_name_too_long(output: Location, path: Path) -> None:
    """Refuse a local path with a name longer than its file system takes (NAME_MAX, 255 bytes on Linux's:
    :func:`~distributed_onnx.local_paths.name_too_long`): made into a folder, it was an ``I/O error`` (exit 3) once
    the run had started, which no rerun could get past."""
    problem = name_too_long(path)
    if problem is not None:
        raise ConfigError(f"--output {output}: {problem}; give a shorter one.", key="output")


#: The bytes a local output's path leaves for what a command writes below it: the deepest is a backtest's
#: ``/forecasts/model=NAME/.tmp-...part-NNNNNN.parquet``, NAME up to 246 bytes percent-quoted (``names.py``).
ROOM_BELOW_AN_OUTPUT = 512


def _refuse_a_path_too_long(output: Location, path: Path) -> None:
    """Refuse a local path longer, whole, than its file system takes (PATH_MAX, 4096 bytes on Linux), less
    :data:`ROOM_BELOW_AN_OUTPUT`: every name short enough, a 5,000-byte path was ``File name too long`` (exit 3)
    once the run had started. The message shows the path's start only: the whole would be a 5,000-byte line."""
    try:
        existing = next((each for each in path.absolute().parents if each.is_dir()), Path("/"))
        limit = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    size = len(os.fsencode(path.absolute()))
    if size > limit - ROOM_BELOW_AN_OUTPUT:
        shown = str(output)
        raise ConfigError(
            f"--output {shown[:60] + '...' if len(shown) > 60 else shown}: its path is {size} bytes (from the "
            f"file system's root), longer than the {limit - ROOM_BELOW_AN_OUTPUT} an output may be on this file "
            f"system ({limit} in all, less {ROOM_BELOW_AN_OUTPUT} for what the command writes in it); give a "
            "shorter one.",
            key="output",
        )


def check_run_folder(output: Location) -> None:
    """Refuse (exit 2) a folder that holds files but no ``run.json``: not a run of this project, or one whose
    record was deleted. Writing into it would overwrite its files (``metrics.parquet``) and leave others inside
    the run's ``forecasts/`` dataset (an older run's parts, anything else), read back as this run's."""
    check_own_folder(output, "A backtest", record=MANIFEST, own=RUN_OWN)


def check_own_folder(output: Location, command: str, *, record: str | None, own: Sequence[str]) -> None:
    """Refuse (exit 2) an existing ``output`` folder that holds files not of ``command``'s making, naming them
    (:func:`look_at_output` says which): a rerun rewrites the command's own entries, and would overwrite or mix
    with anything else. One check for ``backtest`` (``record`` its ``run.json``) and ``score`` (no record: its own
    entries); a local folder that cannot be written is refused first (:func:`check_writable_folder`), as a
    backtest's is: ``score`` failed there only once it wrote (an I/O error advising a rerun)."""
    check_writable_folder(output)
    _refuse_others_files(output, command, record, look_at_output(output, record=record, own=own).others)


def _refuse_others_files(output: Location, command: str, record: str | None, others: Sequence[str]) -> None:
    """:func:`check_own_folder`'s refusal, told the files that are not ``command``'s."""
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        held = f"but no run record ({record})" if record is not None else f"that {command.lower()} does not write"
        raise ConfigError(
            f"--output {output} holds {len(others)} file(s) {held}: {shown}. {command} writes into a new or empty "
            "folder, or one holding its own output: give another --output, or move those files out of it.",
            key="output",
        )


def check_run_entries(output: Location) -> None:
    """Refuse (exit 2) a local run folder the run cannot write into, naming what is in the way and what to do.

    Each was an I/O error (exit 3) advising a rerun that could never succeed: a folder that cannot be written
    (read-only, no permission), a file (or a link to nothing) where the run makes a folder (``removed``), a
    folder where it writes a file (``run.lock``). Cheap: a few ``lstat`` calls, asked before Ray starts."""
    check_writable_folder(output)
    folder = output.local_path
    if folder is None or not folder.is_dir():
        return
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


def check_writable_folder(output: Location) -> None:
    """Refuse (exit 2) a local output folder this process cannot write in: read-only (a read-only mount,
    ``chattr +i``) or without permission. A folder not made yet is asked of the deepest folder above it that
    exists, where it would be made: made there, it failed once the command wrote (``score``: exit 3, "rerun to
    resume", which no rerun gets past). Every command that writes a folder asks it before its work."""
    folder = output.local_path
    if folder is None:
        return
    existing = next((each for each in (folder, *folder.parents) if os.path.lexists(each)), None)
    if existing is None or not existing.is_dir() or os.access(existing, os.W_OK | os.X_OK):
        return  # a file in the way is its own refusal (check_output_folder; the make's NotADirectoryError)
    where = "" if existing == folder else f": it would be made in {existing}, which cannot be written"
    raise ConfigError(
        f"--output {output} cannot be written{where} (read-only, or no permission); make it writable, or give "
        "another --output.",
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
