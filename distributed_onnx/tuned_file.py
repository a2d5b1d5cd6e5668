"""The file ``tune`` writes, as ``backtest --tuned`` reads it: its format, the only keys it may set
(:data:`TUNED_KEYS`), and the checkpoint it was measured on, checked against a run's.

Apart from the measuring (:mod:`.tune`) because a backtest reads the file without measuring anything: what it
takes from the file, and what it refuses (another checkpoint's file, a key tune does not write, an older format),
is decided here without ONNX Runtime.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.local_paths import name_too_long_error, not_a_file
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.identity import CheckpointIdentity, describe_differences, identity_of
from distributed_onnx.redact import redact_text
from distributed_onnx.tune_variants import Choice

#: The file's format, for a reader to refuse another (2: the checkpoint's identity is recorded).
FORMAT = "distributed-onnx tune 2"
#: Format 1 recorded the graph's sha256 only: refused with a word on why (tune again).
FORMAT_WITHOUT_IDENTITY = "distributed-onnx tune 1"
#: The settings tune measures and writes: the only keys ``--tuned`` accepts.
TUNED_KEYS = ("actors", "cpus_per_actor", "rows_per_batch", "graph_optimization")


@dataclass(frozen=True)
class TunedFile:
    """A file ``tune`` wrote, read and checked: its ``settings`` (only :data:`TUNED_KEYS`) and the identity of the
    checkpoint they were measured on."""

    path: Location
    settings: dict[str, Any]
    checkpoint: str
    identity: CheckpointIdentity | None
    #: Which checkpoint a run of the tuned one runs: it, or a variant tune chose (:mod:`.tune_variants`).
    choice: Choice | None = None

    @property
    def source(self) -> tuple[str, dict[str, Any]]:
        """``(file, settings)`` for :meth:`~.settings_sources.CommandSettings.from_sources`."""
        return str(self.path), self.settings

    def checkpoints_to_run(self, checkpoints: Sequence[Path], settings: Any) -> tuple[list[Path], dict[str, Any]]:
        """The run's checkpoints once checked (:meth:`check_checkpoints`), with the file's choice applied (a variant
        in its parent's place: :meth:`.tune_variants.Choice.apply`), and the record of the file for
        ``summary.json``, whatever it changed: its ``settings`` the run took (``settings``: the run's, after every
        source), those a user's flag, environment or ``--config`` ``overridden``, and its choice (None: it holds
        none). ``said`` (shown on stderr and in the report's notes) names the file and what it changed, so the file
        a run used is never silent (a file without a choice once left no trace anywhere)."""
        resolved = [LocalCheckpoint(path=path).resolve() for path in checkpoints]
        self._check(resolved)
        used, overridden = self._taken(settings)
        taken = {"settings": used, "overridden": overridden}
        if self.choice is None or self.identity is None:
            said = f"distributed-onnx backtest --tuned {self.path}: {_settings_said(used, overridden)}; it holds no "
            said += "choice of checkpoint (no variant was chosen): the checkpoints ran as given"
            record: dict[str, Any] = {"file": str(self.path), "choice": None, "replaced": {}, "said": said}
            return list(checkpoints), record | taken
        run = [(path, identity_of(checkpoint)) for path, checkpoint in zip(checkpoints, resolved, strict=True)]
        paths, record = self.choice.apply(run, self.identity)
        return paths, record | taken | {"settings_said": _settings_said(used, overridden)}

    def _taken(self, settings: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The file's settings the run holds (taken from it), and those it holds otherwise: ``{key: {"tuned": the
        file's, "used": the run's}}`` (a flag, the environment or ``--config`` is above the file)."""
        used = {key: tuned for key, tuned in self.settings.items() if getattr(settings, key) == tuned}
        overridden = {
            key: {"tuned": tuned, "used": getattr(settings, key)}
            for key, tuned in self.settings.items()
            if key not in used
        }
        return used, overridden

    def check_checkpoints(self, checkpoints: Sequence[Path]) -> None:
        """Refuse a run none of whose ``checkpoints`` has the identity the file was tuned on (or that of the variant
        it chose), naming both."""
        self._check([LocalCheckpoint(path=path).resolve() for path in checkpoints])

    def _check(self, resolved: Sequence[ResolvedCheckpoint]) -> None:
        identities = {each.name: identity_of(each) for each in resolved}
        tuned_name = Path(self.checkpoint).stem
        if self.identity is None:
            raise ConfigError(
                f"{self.path} records no checkpoint identity, so nothing says it was tuned for "
                f"{', '.join(identities)}: run distributed-onnx tune again, or distributed-onnx backtest without "
                "--tuned",
                path=str(self.path),
            )
        accepted = [self.identity, *([self.choice.identity] if self.choice and self.choice.identity else [])]
        if any(not known.differences(each) for known in accepted for each in identities.values()):
            return
        name = tuned_name if tuned_name in identities else next(iter(identities))
        found = identities[name]
        differences = describe_differences(self.identity.differences(found), "tuned", f"this run's {name}")
        raise ConfigError(
            f"{self.path} was tuned for checkpoint {tuned_name} (identity {self.identity.digest}), not for this "
            f"run's {name} (identity {found.digest}): {differences}. The speed measured on one checkpoint says "
            f"little about another: tune this one (distributed-onnx tune {resolved[0].weights_path}), or run "
            "distributed-onnx backtest without --tuned",
            key="tuned",
            path=str(self.path),
        )


def _settings_said(used: Mapping[str, Any], overridden: Mapping[str, Mapping[str, Any]]) -> str:
    """What a tuned file's settings changed, in words: those taken, those given otherwise above the file."""
    said = f"ran with its {', '.join(f'{key}={value}' for key, value in used.items())}" if used else "took none of it"
    if overridden:
        above = ", ".join(f"{key}={each['used']} (its {each['tuned']})" for key, each in overridden.items())
        said += f"; a flag, the environment or --config gave {above}"
    return said


def tuned_lines(record: Mapping[str, Any]) -> list[str]:
    """The lines ``backtest --tuned`` says on stderr: what the file's settings changed, and its choice."""
    return [line for line in (record.get("settings_said"), record["said"]) if line]


def load_tuned(given: LocationLike) -> TunedFile:
    """Read a file ``tune`` wrote (a path or a URL, as its ``--output``; named redacted): its format, only the keys
    tune writes under ``settings``, the checkpoint's identity (compared with the run's by
    :meth:`TunedFile.check_checkpoints`)."""
    path = Location.parse(given)
    try:
        there = not_a_file(path.local_path) if path.local_path is not None else None
        if there is not None:  # a folder, a link in a loop or to nothing, a device: said, not errno's "not JSON"
            msg = f"Tuned settings file {path} {there}; give the JSON file distributed-onnx tune wrote"
            raise ConfigError(msg, path=str(path))
        document = json.loads(storage.read_bytes(path))
    except FileNotFoundError as exc:
        msg = f"Tuned settings file not found: {path}; write it with distributed-onnx tune"
        raise ConfigError(msg, path=str(path)) from exc
    except (OSError, ValueError) as exc:
        if (too_long := name_too_long_error(exc)) is not None:  # the path, not the file: say so (local_paths)
            raise too_long from exc
        msg = f"Tuned settings file {path} is not JSON ({path.scrub(str(exc))}); write it with distributed-onnx tune"
        raise ConfigError(msg, path=str(path)) from exc
    settings = document.get("settings") if isinstance(document, dict) else None
    if isinstance(settings, dict) and document.get("format") == FORMAT_WITHOUT_IDENTITY:
        raise ConfigError(
            f"{path} was written by an older distributed-onnx tune ({FORMAT_WITHOUT_IDENTITY!r}), which did not "
            f"record the identity of the checkpoint it measured: run distributed-onnx tune again",
            path=str(path),
        )
    if not isinstance(settings, dict) or document.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a tuned settings file (expected format {FORMAT!r} with a 'settings' mapping); "
            "write it with distributed-onnx tune",
            path=str(path),
        )
    foreign = [key for key in settings if key not in TUNED_KEYS]
    if foreign:
        raise ConfigError(
            f"Invalid tuned settings: settings.{foreign[0]} [from {path}] is not a key distributed-onnx tune "
            f"writes; a tuned file holds only {', '.join(TUNED_KEYS)}. Give {foreign[0]} as a flag or in --config, "
            "and remove it from the file",
            key=foreign[0],
            path=str(path),
        )
    recorded = document.get("checkpoint_identity")
    identity = CheckpointIdentity.from_record(recorded)
    if identity is None and recorded is not None:  # there, but not the record tune writes: not "records none"
        shown = redact_text(" ".join(json.dumps(recorded, default=str).split()))[:80]
        raise ConfigError(
            f"{path} records checkpoint_identity as a {type(recorded).__name__} ({shown}), not the identity record "
            "tune writes (a mapping with the graph's sha256 and the metadata fields): the file was edited or "
            "damaged; run distributed-onnx tune again, or distributed-onnx backtest without --tuned",
            key="tuned",
            path=str(path),
        )
    choice = Choice.from_record(document.get("choice"), str(path))
    return TunedFile(path, dict(settings), str(document.get("checkpoint") or "?"), identity, choice)


def read_tuned(path: LocationLike) -> tuple[str, dict[str, Any]]:
    """``(file, settings)`` of a file ``tune`` wrote, for :meth:`~.settings_sources.CommandSettings.from_sources`
    (:func:`load_tuned`, less the checkpoint's identity)."""
    return load_tuned(path).source
