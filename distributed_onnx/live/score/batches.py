"""What each run of ``score`` settled, kept so that a rerun scores only what is new (like a resumed backtest).

Each run writes one ``scored/batch-NNNNNN.npz`` (atomically, through :mod:`distributed_onnx.storage`): the
metric sums of each group it scored (:meth:`~distributed_onnx.evaluation.scoring.pairs.PairScores.state`,
plain arrays, no pickle), the (model, window id, outcome) keys it settled, the log files all of whose windows
are settled (skipped unread next time), the span of request times of the windows it settled (the report's
header covers the whole log without reading it again) and, per model, the levels its settled windows' files
record as served clamped (``summary.json``'s ``quantile_clamping`` covers the whole log the same way). The
metrics of a score directory are the sums of every batch, added in batch order, so a rerun reproduces the same
numbers. A torn or foreign batch is an error naming
it, never skipped: skipping it would silently drop its windows from every metric.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.live.score.join import GroupKey
from distributed_onnx.location import Location

SCORED_DIR = "scored"
BATCH_FORMAT = 3


@dataclass
class ScoreBatch:
    """What one run of ``score`` settled: scores per group, the windows' keys and outcomes, the files done."""

    index: int
    files_done: list[str] = field(default_factory=list)
    sums: dict[GroupKey, PairScores] = field(default_factory=dict)
    keys: list[tuple[str, str, str]] = field(default_factory=list)  # model, window_id, outcome
    #: The first and last request time (us since the epoch) of the windows settled here; None if none.
    request_time_span_us: tuple[int, int] | None = None
    #: Per model: (requested, served by) of each level its settled windows' log files record as clamped.
    clamping: dict[str, set[tuple[float, float]]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        groups = sorted(self.sums)
        arrays: dict[str, np.ndarray] = {}
        for number, key in enumerate(groups):
            arrays.update(self.sums[key].state(f"g{number}."))
        header = {
            "format": BATCH_FORMAT,
            "index": self.index,
            "files_done": self.files_done,
            "groups": [
                {"models": list(models), "horizon": h, "quantiles": list(q), "resolution_minutes": r}
                for models, h, q, r in groups
            ],
            "request_time_span_us": None if self.request_time_span_us is None else list(self.request_time_span_us),
            "quantile_clamping": {model: sorted(pairs) for model, pairs in sorted(self.clamping.items())},
        }
        arrays["header"] = np.asarray(json.dumps(header))
        columns = list(zip(*self.keys, strict=True)) if self.keys else [(), (), ()]
        for name, values in zip(("keys.model", "keys.window_id", "keys.outcome"), columns, strict=True):
            arrays[name] = np.asarray(values, dtype=np.str_)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> ScoreBatch:
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
                header = json.loads(str(arrays["header"]))
                if header.get("format") != BATCH_FORMAT:
                    raise DataError(f"score batch of another format: {header.get('format')!r}")
                batch = cls(int(header["index"]), list(header["files_done"]))
                for number, group in enumerate(header["groups"]):
                    key = (
                        tuple(str(model) for model in group["models"]),
                        int(group["horizon"]),
                        tuple(float(q) for q in group["quantiles"]),
                        int(group["resolution_minutes"]),
                    )
                    batch.sums[key] = PairScores.from_state(arrays, f"g{number}.")
                batch.keys = list(
                    zip(
                        arrays["keys.model"].tolist(),
                        arrays["keys.window_id"].tolist(),
                        arrays["keys.outcome"].tolist(),
                        strict=True,
                    )
                )
                span = header.get("request_time_span_us")  # absent in batches written before it was recorded
                batch.request_time_span_us = None if span is None else (int(span[0]), int(span[1]))
                clamping = header.get("quantile_clamping") or {}  # absent in batches written before it was kept
                batch.clamping = {
                    str(model): {(float(requested), float(served)) for requested, served in pairs}
                    for model, pairs in clamping.items()
                }
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"unreadable score batch: {exc}") from exc
        return batch


def batch_path(output: Location, index: int) -> Location:
    return storage.join(output, SCORED_DIR, f"batch-{index:06d}.npz")


def read_batches(output: Location) -> list[ScoreBatch]:
    """The batches of earlier runs, in order; a torn or foreign one is an error naming it (never skipped)."""
    batches = []
    for path in storage.list_files(storage.join(output, SCORED_DIR), "batch-", ".npz"):
        try:
            batches.append(ScoreBatch.from_bytes(storage.read_bytes(path)))
        except DataError as exc:
            raise DataError(f"{path}: {exc}; delete it (and rerun) to score its windows again", path=str(path)) from exc
    return batches


def write_batch(output: Location, batch: ScoreBatch) -> None:
    storage.make_dirs(storage.join(output, SCORED_DIR))
    storage.write_bytes(batch_path(output, batch.index), batch.to_bytes())


def merged_sums(batches: Sequence[ScoreBatch]) -> dict[GroupKey, PairScores]:
    """Every group's scores over all batches, added in batch order (so a rerun reproduces the same numbers)."""
    merged: dict[GroupKey, PairScores] = {}
    for batch in sorted(batches, key=lambda b: b.index):
        for key, scores in batch.sums.items():
            if key not in merged:
                merged[key] = PairScores(scores.models, scores.quantiles, scores.horizon)
            merged[key].merge(scores)
    return merged


def widen(span: tuple[int, int] | None, values_us: Sequence[int]) -> tuple[int, int] | None:
    """``span`` widened to hold ``values_us`` (None stays None when there is nothing)."""
    if not len(values_us):
        return span
    low, high = int(min(values_us)), int(max(values_us))
    return (low, high) if span is None else (min(span[0], low), max(span[1], high))
