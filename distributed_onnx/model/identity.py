"""A checkpoint's identity: its graph's sha256, its external weights' and every metadata field that can change an
output.

Two checkpoints with the same identity forecast the same numbers and are scored the same way; two with
different identities may not. Everything that asks "is this the checkpoint that computed (or was measured for)
that?" compares this one record: a backtest's resume (``run.json`` records each checkpoint's, and the part
files carry its digest in their model fingerprint), a variant's parent (``parent.identity`` in the variant's
metadata against the run's checkpoints) and a tuned settings file (``tune`` records the checkpoint's).

The graph is every file it loads: the ``.onnx`` file and the files its tensors keep their values in (ONNX
external data, ``NAME.onnx.data`` for every family ``export`` writes: :mod:`.external_data`), each by its sha256,
under the location the graph names it by. A weights file edited beside an unchanged graph is another identity.
Hashing a weights file of gigabytes at every command would cost more than the command, so the digests are kept
per version of the file (:mod:`.file_digests`: path, inode, size, modification and change times).

Which fields count is derived from :class:`~.checkpoint.CheckpointMetadata` itself: **every field counts unless
it is marked** ``json_schema_extra=DESCRIPTIVE``, so a field added to the metadata later counts without anyone
remembering to list it here. The fields marked descriptive, and why none of them changes an output:

- ``sha256``: the graph's recorded digest. The identity holds the graph's digest itself (the recorded one,
  which resolving verifies, else the file's), so the field adds nothing.
- ``description``: free text.
- ``parent`` and ``quantization``: provenance, how the graph was made. What the making did to the numbers is in
  the graph, and so in its digest.
- ``schema_version``: the layout of the metadata file (only version 2 is read).

Everything else counts, limits included: ``max_covariates`` also sizes the padding rows of a frozen covariate
axis, ``max_horizon_length`` and ``precision`` decide which runs and which providers a checkpoint gets,
``training_data_end`` which windows are scored apart as in-sample. Counting a field that turns out to change
nothing costs a refused resume; leaving out one that does costs a silently mixed run.

A record written before external weights were counted holds none: a checkpoint with external weights then
differs from it (its files "not recorded"), since nothing says which weights computed what it records.

A field missing from a record counts as its default: the metadata model reads a missing key the same way (files
written before the field existed meant the default), and the digest leaves out fields at their defaults, so
adding a field with a default changes no digest recorded before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from distributed_onnx.errors import CheckpointNotFoundError
from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint
from distributed_onnx.model.external_data import external_data_locations
from distributed_onnx.model.file_digests import file_sha256

__all__ = [
    "EXTERNAL_PREFIX",
    "CheckpointIdentity",
    "Difference",
    "descriptive_fields",
    "describe_differences",
    "identity_fields",
    "identity_of",
]


def _is_descriptive(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("descriptive") is True


def descriptive_fields(model: type[CheckpointMetadata] = CheckpointMetadata) -> tuple[str, ...]:
    """The metadata fields marked descriptive (module docstring): left out of the identity."""
    return tuple(name for name, info in model.model_fields.items() if _is_descriptive(info))


def identity_fields(model: type[CheckpointMetadata] = CheckpointMetadata) -> tuple[str, ...]:
    """Every other field of the metadata model, in its order: what an identity compares besides the graph."""
    return tuple(name for name, info in model.model_fields.items() if not _is_descriptive(info))


#: A required field absent from a record (no default to read it as), or one this version does not know.
NOT_RECORDED = "(not recorded)"


def _default(name: str) -> Any:
    info = CheckpointMetadata.model_fields.get(name)
    if info is None or info.is_required():
        return NOT_RECORDED
    return to_jsonable_python(info.get_default(call_default_factory=True))


#: What :class:`Difference` names an external weights file by: ``external data NAME.onnx.data``.
EXTERNAL_PREFIX = "external data "


class Difference(NamedTuple):
    """One part of two identities that differs: ``field`` (``sha256`` for the graph, ``external data LOCATION``
    for a weights file) and both values."""

    field: str
    recorded: Any
    current: Any


@dataclass(frozen=True)
class CheckpointIdentity:
    """The graph's sha256, each external weights file's (by the location the graph names it by) and the JSON value
    of every field of :func:`identity_fields`."""

    sha256: str
    fields: Mapping[str, Any]
    external: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, metadata: CheckpointMetadata, graph_sha256: str, external: Mapping[str, str] | None = None
    ) -> CheckpointIdentity:
        values = metadata.model_dump(mode="json")
        return cls(graph_sha256, {name: values[name] for name in identity_fields()}, dict(external or {}))

    @classmethod
    def from_record(cls, record: Any) -> CheckpointIdentity | None:
        """The identity a :meth:`record` wrote (None for anything else: a file written before records existed)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("sha256"), str):
            return None
        fields = record.get("fields")
        external = record.get("external")
        return cls(
            record["sha256"],
            dict(fields) if isinstance(fields, Mapping) else {},
            {str(k): str(v) for k, v in external.items()} if isinstance(external, Mapping) else {},
        )

    def value(self, name: str) -> Any:
        """A field's value; one this record lacks is its default (module docstring)."""
        return self.fields[name] if name in self.fields else _default(name)

    @property
    def digest(self) -> str:
        """16 hex digits over the graph's sha256, the external files' (when the graph has any: a single-file
        checkpoint's digest is the one recorded before they counted) and the fields not at their defaults."""
        kept = {name: self.value(name) for name in sorted(self._names()) if self.value(name) != _default(name)}
        document: dict[str, Any] = {"sha256": self.sha256, "fields": kept}
        if self.external:
            document["external"] = dict(self.external)
        text = json.dumps(document, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        """The JSON record kept beside what the identity decided (``run.json``, a tuned file, a variant)."""
        record = {"digest": self.digest, "sha256": self.sha256, "fields": dict(self.fields)}
        return record | ({"external": dict(self.external)} if self.external else {})

    def differences(self, other: CheckpointIdentity) -> list[Difference]:
        """What differs from ``other`` (``self`` is the recorded side): the graph first, its external weights files
        next (one absent from a side is ``(not recorded)`` there), then each field."""
        found = [Difference("sha256", self.sha256, other.sha256)] if self.sha256 != other.sha256 else []
        for location in sorted(set(self.external) | set(other.external)):
            mine, theirs = self.external.get(location, NOT_RECORDED), other.external.get(location, NOT_RECORDED)
            if mine != theirs:
                found.append(Difference(EXTERNAL_PREFIX + location, mine, theirs))
        names = [name for name in identity_fields() if name in self._names() | other._names()]
        names += sorted((self._names() | other._names()) - set(names))  # fields this version does not know
        found += [Difference(n, self.value(n), other.value(n)) for n in names if self.value(n) != other.value(n)]
        return found

    def _names(self) -> set[str]:
        return set(self.fields) | set(identity_fields())


def identity_of(checkpoint: ResolvedCheckpoint) -> CheckpointIdentity:
    """A resolved checkpoint's identity: the graph's sha256 as the metadata records it (resolving verified it),
    else the file's; and the sha256 of each external weights file the graph names.

    Raises:
        CheckpointNotFoundError: a weights file the graph names is not there (naming both).
    """
    metadata, graph = checkpoint.metadata, checkpoint.weights_path
    external = {}
    for location in external_data_locations(graph):
        path = graph.parent / location
        if not path.is_file():
            raise CheckpointNotFoundError(
                f"Checkpoint weights {path} not found: the graph {graph} keeps its weights in {location} beside "
                "it (ONNX external data). Copy that file beside the .onnx file.",
                path=str(path),
            )
        external[location] = file_sha256(path)
    return CheckpointIdentity.of(metadata, metadata.sha256 or file_sha256(graph), external)


def describe_differences(differences: Sequence[Difference], recorded: str, current: str, limit: int = 4) -> str:
    """``native_quantiles [0.1, 0.5, 0.9] (recorded) against [0.2, 0.5, 0.8] (this checkpoint)``, joined by "; ",
    at most ``limit`` of them and a count of the rest."""
    shown = [
        f"{d.field} {_text(d.recorded)} ({recorded}) against {_text(d.current)} ({current})"
        for d in differences[:limit]
    ]
    rest = len(differences) - limit
    return "; ".join(shown) + (f"; and {rest} more field(s)" if rest > 0 else "")


def _text(value: Any) -> str:
    text = value if isinstance(value, str) and value == NOT_RECORDED else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
