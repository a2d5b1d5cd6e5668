"""The record of one task x checkpoint, ``pairs/TASK/MODEL.json``: fev's summary once the pair is done, or why
fev rejected the task; either under the pair's key (what its outcome depends on).

A rerun reads the record instead of doing the work again: a done pair is not recomputed, and a rejected one is
not loaded, forecast and scored again only for fev to reject it the same way (the record names the reason, and
the run still ends with exit 1 while the benchmark holds the task). A record under another key (the task, the
checkpoint's identity or fev's version changed) is ignored and the pair computed again. Pure: no Ray.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from distributed_onnx import storage
from distributed_onnx.evaluation.fev_tasks.fev_import import FEV_VERSION
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.identity import identity_of

#: The record's field for a done pair (fev's ``evaluation_summary``) and for a rejected one (fev's reason).
SUMMARY = "summary"
REJECTED = "rejected"


def pair_key(task: Any, checkpoint: ResolvedCheckpoint) -> str:
    """What a pair's outcome depends on: the task's definition, the checkpoint's identity (its graph and every
    metadata field that changes an output: :mod:`distributed_onnx.model.identity`), fev's version. Not the
    data's fingerprint: knowing it takes loading the data, which a resumed pair must not need (a hub dataset
    needs the network); a dataset rewritten in place needs a new output directory."""
    document = [task.to_dict(), identity_of(checkpoint).digest, FEV_VERSION]
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _path(output: Location, slug: str, model: str) -> Location:
    return storage.join(output, "pairs", slug, f"{model}.json")


def read_pair(output: Location, slug: str, model: str, key: str) -> dict[str, Any] | None:
    """The record an earlier run wrote for this pair if its key matches: ``{"summary": {...}}`` (done) or
    ``{"rejected": "reason"}``; None otherwise (no record, another key, a record that does not parse)."""
    path = _path(output, slug, model)
    if not storage.is_file(path):
        return None
    try:
        document = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("key") != key:
        return None
    if isinstance(document.get(SUMMARY), dict):
        return {SUMMARY: document[SUMMARY]}
    if isinstance(document.get(REJECTED), str):
        return {REJECTED: document[REJECTED]}
    return None


def write_pair(output: Location, slug: str, model: str, key: str, outcome: dict[str, Any]) -> None:
    """Record a done pair (``{"summary": ...}``) or a rejected one (``{"rejected": reason}``) under ``key``."""
    record = {name: outcome[name] for name in (SUMMARY, REJECTED) if name in outcome}
    storage.make_dirs(storage.join(output, "pairs", slug))
    storage.write_bytes(_path(output, slug, model), json.dumps({"key": key, **record}).encode())


def plain(value: Any) -> Any:
    """A summary as plain JSON: NaN and infinities as null (fev's readers take null as missing)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalars
        return plain(value.item())
    return value
