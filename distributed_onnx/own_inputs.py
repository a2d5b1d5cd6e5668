"""No command writes over one of its own inputs: the one check every writing command makes before its work.

Why one rule and not each command's own: ``tune --output`` was checked only for being writable, so
``tune m/bolt.onnx --output m/bolt.metadata.json`` (or ``--output`` the weights, their external data, or the
``--data`` table) measured for its whole budget, then replaced that file with its JSON and said ``wrote ...``
(exit 0): the checkpoint or the data gone. The same holds for any command that writes where it reads, so each one
names what it writes (:class:`Written`: a file, or a folder and the entries it writes in it) and what it reads
(:class:`Read`: a checkpoint is every file of it, its variants' included) and calls :func:`check_own_inputs`, which
compares *resolved* paths (``./m/../m/x`` and a link to ``x`` are ``x``), and URLs by their whole text. Each
record holds a :class:`~distributed_onnx.location.Location`, parsed once where the user gave it (the command's
settings): the comparison and the refusal's words read that one, never parsing it again.

>>> from distributed_onnx.location import Location
>>> check_own_inputs([Written("output", Location("tune.json"))], [Read("data", Location("load.parquet"))])
>>> check_own_inputs([Written("output", Location("load.parquet"))], [Read("data", Location("./x/../load.parquet"))])
Traceback (most recent call last):
...
distributed_onnx.errors.ConfigError: --output load.parquet is the --data file x/../load.parquet: a command never ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location

__all__ = ["Read", "Written", "check_own_inputs", "checkpoint_files"]

#: The files of checkpoint ``NAME.onnx`` beside it, by suffix (OpenSTEF's metadata, ``export``'s external data
#: and parity report); its variants are ``NAME-*`` with the same suffixes.
CHECKPOINT_SUFFIXES = (".onnx", ".metadata.json", ".onnx.data", ".parity.json")


@dataclass(frozen=True)
class Written:
    """What a command writes (``flag``: the setting that names it, shown as its flag, or a positional argument's
    name as the command's help shows it, :func:`~distributed_onnx.settings_flags.flag_name`): a file, or a
    folder (``entries``: the names it writes in it; a folder's other contents are left alone, so an input there is
    no concern)."""

    flag: str
    location: Location
    entries: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Read:
    """What a command reads: the flag that names it, and its files (a checkpoint's: :func:`checkpoint_files`)."""

    flag: str
    location: Location
    what: str = "file"
    files: tuple[Path, ...] = field(default=())


def checkpoint_files(weights: Path, flag: str, *, variants: bool = True) -> Read:
    """Checkpoint ``weights`` as an input (``flag``: the setting naming it): its weights, metadata, external data
    and parity report, and its variants' beside it (``NAME-*``: tune reads them), present or not."""
    weights = weights if weights.suffix == ".onnx" else weights.with_name(weights.name.removesuffix(".metadata.json"))
    stem = weights.name.removesuffix(".onnx")
    files = [weights.with_name(stem + suffix) for suffix in CHECKPOINT_SUFFIXES]
    if variants and weights.parent.is_dir():
        files += sorted(
            path
            for path in weights.parent.glob(f"{stem}-*")
            if any(path.name.endswith(suffix) for suffix in CHECKPOINT_SUFFIXES)
        )
    return Read(flag, Location(weights), "checkpoint", tuple(files))


def check_own_inputs(written: Iterable[Written], read: Iterable[Read]) -> None:
    """Refuse (exit 2, naming both flags and the file) a write that would land on something read: a file written
    that is an input file (or its folder's written entry holding one), or an input's folder written as a file."""
    inputs = [(each, key) for each in read for key in (_file_keys(each.files) or (_key(each.location),))]
    for output in written:
        place = _key(output.location)
        targets = [place] if output.entries is None else [place, *(_join(place, name) for name in output.entries)]
        for source, key in inputs:
            for target in targets:
                if key == target or (target is not place and _below(key, target)):
                    _refuse(output, source, key, target is place)


def _refuse(output: Written, source: Read, key: str, whole: bool) -> None:
    """One line: the flag and what it names, the input's flag and the file of it that would be lost."""
    given = f"{_flag(output.flag)} {output.location} {'is' if whole else 'would write over'}"
    if source.files:
        lost = f"{Location.parse(key)}, a file of the {source.what} {_given(source)}"
    else:
        flag = _flag(source.flag)
        lost = (
            f"the {flag} {source.what} {source.location}"
            if flag.startswith("--")
            else f"the {source.what} {_given(source)}"
        )
    raise ConfigError(
        f"{given} {lost}: a command never writes over one of its own inputs; give another {_flag(output.flag)}.",
        key=output.flag,
    )


def _flag(name: str) -> str:
    """A setting's flag (``data`` -> ``--data``); a positional argument's name as the command's help shows it
    (``CHECKPOINT.onnx``) as it is."""
    return f"--{name.replace('_', '-')}" if name.isidentifier() and name.islower() else name


def _given(source: Read) -> str:
    """How the user gave ``source``: ``--checkpoint m/x.onnx``, or ``m/x.onnx (the CHECKPOINT.onnx argument)``: a
    positional argument's name before the path read as a placeholder ("the checkpoint CHECKPOINT /tmp/...")."""
    flag, where = _flag(source.flag), source.location
    return f"{flag} {where}" if flag.startswith("--") else f"{where} (the {flag} argument)"


def _key(location: Location) -> str:
    """A comparable form: a local path resolved (links and ``..`` followed, relative to here), a URL's whole text."""
    local = location.local_path
    if local is None:
        return location.reveal().rstrip("/")
    return os.path.realpath(local)


def _file_keys(files: tuple[Path, ...]) -> list[str]:
    """The comparable forms of an input's files (local paths: a checkpoint's), resolved as :func:`_key` does."""
    return [os.path.realpath(path) for path in files]


def _join(place: str, name: str) -> str:
    return os.path.realpath(os.path.join(place, name)) if "://" not in place else f"{place}/{name}"


def _below(key: str, folder: str) -> bool:
    return key.startswith(folder.rstrip("/") + "/")
