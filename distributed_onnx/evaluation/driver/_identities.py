"""Resume compares checkpoint identities: a run directory never mixes forecasts of two meanings of one checkpoint.

``run.json`` records the identity (:mod:`distributed_onnx.model.identity`: the graph's sha256 and every metadata
field that changes an output) of each checkpoint that has computed forecasts here. A rerun whose checkpoint of
the same name has another identity (its metadata's ``native_quantiles`` edited, its graph replaced) while that
checkpoint's forecasts are still in ``forecasts/`` is refused before anything is read or deleted, naming each
field that differs with both values and what to do. Resuming it would keep the parts computed under the old
meaning beside new ones: a silently mixed run.

It runs before the run's fingerprint is compared (:func:`~distributed_onnx.evaluation.run_manifest.prepare_output`):
a field that changes the windows or the levels as well (``context_length``, ``horizon_patches``, the native
levels a run forecasts by default, ``training_data_end``) changes the fingerprint too, and the refusal must still
name the field and both values, not only two fingerprints. Then nothing in the directory can be reused, and the
only way on is another ``--output``.

The refusal is the message; the guarantee is the part files: each carries its model's fingerprint, which holds
the identity's digest (:mod:`..planning`), so a part computed under another identity never verifies and is redone,
whatever ``run.json`` says (a directory written before identities were recorded is so recomputed whole).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation import outputs
from distributed_onnx.location import Location
from distributed_onnx.model.identity import CheckpointIdentity, describe_differences

__all__ = ["CHECKPOINTS_KEY", "check_identities", "identity_records"]

logger = logging.getLogger(__name__)

#: ``run.json``'s key: each checkpoint's identity record, by name.
CHECKPOINTS_KEY = "checkpoints"


def identity_records(identities: Mapping[str, CheckpointIdentity]) -> dict[str, Any]:
    """``run.json``'s record of the run's checkpoints (written with the manifest of a new directory)."""
    return {CHECKPOINTS_KEY: {name: identity.record() for name, identity in identities.items()}}


def check_identities(
    output: Location, identities: Mapping[str, CheckpointIdentity], run_fingerprint: str | None = None
) -> None:
    """Refuse a checkpoint whose identity differs from the one recorded while its forecasts are here; record
    the identities of checkpoints new to the directory (or whose forecasts were moved out of it).

    Called before :func:`~distributed_onnx.evaluation.run_manifest.prepare_output` compares the run's fingerprint
    (module docstring); a directory without a readable manifest is left to it (a new one records the identities
    with its manifest). With a ``run_fingerprint`` other than the recorded one, a changed identity is refused
    whether or not its forecasts are here (nothing of that run can be reused), and nothing is recorded. Raises
    :class:`ConfigError` (exit 2) naming the checkpoint, each field with both values, and the ways on.
    """
    path = storage.join(output, outputs.MANIFEST)
    if not storage.is_file(path):
        return
    try:
        document = json.loads(storage.read_retrying(lambda: storage.read_bytes(path), str(path)).decode("utf-8"))
    except ValueError:  # not a manifest: prepare_output refuses it, naming it
        return
    if not isinstance(document, dict):
        return
    recorded = document.get(CHECKPOINTS_KEY)
    previous = document.get("fingerprint")
    if run_fingerprint is not None and previous != run_fingerprint:
        for name, identity in identities.items():
            before = CheckpointIdentity.from_record(recorded.get(name)) if isinstance(recorded, dict) else None
            if before is not None and before.differences(identity):
                raise _refusal(output, name, before, identity, (str(previous), run_fingerprint))
        return  # other settings, the same checkpoints: prepare_output refuses, naming the settings
    if not isinstance(recorded, dict):
        if outputs.has_scored_parts(output):
            logger.warning(
                "%s was written before checkpoint identities were recorded: its parts are computed again, once",
                output,
            )
        recorded = {}
    changed = False
    for name, identity in identities.items():
        before = CheckpointIdentity.from_record(recorded.get(name))
        if before is not None and not before.differences(identity):
            continue
        if before is not None and _has_forecasts(output, name):
            raise _refusal(output, name, before, identity)
        if before is not None:
            logger.info("Checkpoint %r changed identity; none of its forecasts are left here: recomputed", name)
        recorded[name] = identity.record()
        changed = True
    if changed:
        document[CHECKPOINTS_KEY] = recorded
        storage.write_bytes(path, json.dumps(document, indent=2, default=str).encode())


def _has_forecasts(output: Location, name: str) -> bool:
    return bool(storage.list_files(outputs.model_dir(output, name), "part-", ".parquet"))


def _refusal(
    output: Location,
    name: str,
    before: CheckpointIdentity,
    now: CheckpointIdentity,
    fingerprints: tuple[str, str] | None = None,
) -> ConfigError:
    """The refusal of a changed identity; ``fingerprints`` (recorded, this run's) when the change also changed
    the run's fingerprint: then no forecast of the directory can be reused, and moving one checkpoint's out
    would only meet the fingerprint's refusal."""
    folder = str(outputs.model_dir(output, name))
    differences = describe_differences(before.differences(now), "recorded", "now")
    said = (
        f"{output} holds forecasts of checkpoint {name!r} computed under another identity "
        f"(identity {before.digest} recorded, {now.digest} now): {differences}."
    )
    if fingerprints is not None:
        return ConfigError(
            f"{said} The change also changes the run's windows or levels (run fingerprint {fingerprints[0]} "
            f"recorded, {fingerprints[1]} now), so nothing in {output} can be reused: use another --output "
            f"(the run in {output} stays as it is).",
            key="output",
        )
    return ConfigError(
        f"{said} Resuming would mix forecasts of two meanings of {name!r}. Use another --output, or move {folder} "
        "out of the run directory to compute its forecasts again (the other checkpoints' are kept).",
        key="output",
    )
