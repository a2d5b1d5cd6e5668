"""Backtest window planning: pure, deterministic, and sized by series, never by windows.

A window's *origin* is its first forecast step; ``cutoff = origin - resolution`` is its last context step
(Nixtla's convention). Its context is the ``context_length`` steps before the origin, its target the
``horizon`` steps from the origin. The windows of a run form one sequence: series after series, origins
ascending. The driver keeps only each series' window count (:class:`WindowPlan`), cuts the sequence into
parts of consecutive windows (:class:`PartSpec`: three integers) and sends those; the actor that runs a part
recomputes the part's origins from the series data it holds (:func:`plan_series` is a pure function of the
series and the spec), so nothing per window ever leaves the driver, and a rerun plans the same parts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from distributed_onnx.evaluation.data.layout import FlatSeries, Series, SeriesArrays


class WindowSpec(BaseModel):
    """Which windows a backtest runs (see the ``backtest`` command for the meaning of each field)."""

    model_config = ConfigDict(frozen=True)

    context_length: int = Field(gt=0, description="Context steps fed to the model.")
    horizon: int = Field(gt=0, description="Forecast steps per window.")
    n_windows: int | None = Field(default=None, gt=0, description="Windows per series, Nixtla style.")
    stride: int = Field(default=1, gt=0, description="Steps between consecutive origins.")
    start_us: int | None = Field(default=None, description="First origin (UTC microseconds), with end_us.")
    end_us: int | None = Field(default=None, description="Last origin (UTC microseconds), with start_us.")
    min_context_coverage: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Skip windows whose context has a smaller observed share."
    )

    @model_validator(mode="after")
    def _one_mode(self) -> WindowSpec:
        by_count = self.n_windows is not None
        by_range = self.start_us is not None or self.end_us is not None
        if by_count == by_range:
            msg = "give either n_windows (counted back from each series' end) or both start and end"
            raise ValueError(msg)
        if by_range and (self.start_us is None or self.end_us is None or self.end_us < self.start_us):
            msg = "start and end must both be given, with start <= end"
            raise ValueError(msg)
        return self


@dataclass(frozen=True)
class SeriesPlan:
    """The windows of one series: kept origin indices (ascending) and what was left out, and why."""

    origins: np.ndarray  # int64 [n]
    skipped: int  # too little observed context (min_context_coverage, or none at all)
    capped: int  # asked for by n_windows but before the series has any history


@dataclass(frozen=True)
class PlannedBatch:
    """Windows of one model batch: parallel arrays of series index and origin index."""

    index: int
    series_index: np.ndarray  # int64 [W]
    origin_index: np.ndarray  # int64 [W]
    #: With ``--group-by``: each window's group (windows sharing one are forecast jointly), else None.
    group: np.ndarray | None = None

    @property
    def n_windows(self) -> int:
        return int(self.origin_index.shape[0])


@dataclass(frozen=True)
class PartSpec:
    """A unit of work: windows ``[start, stop)`` of the run's window sequence, written as part ``index``.

    Three integers on purpose, and what the driver knows of the part's files: this is all that crosses from the
    driver to an actor per unit of work. ``written`` names the models whose forecasts of this part may already
    be written (the actor reads them back if they verify); ``()`` when the driver knows none is (a fresh run:
    the actor then opens no footer), ``None`` when it does not know (the actor checks every model).
    """

    index: int
    start: int
    stop: int
    written: tuple[str, ...] | None = None

    def __reduce__(self) -> tuple[type[PartSpec], tuple[int, int, int, tuple[str, ...] | None]]:
        # Pickled as its four values (no field names): a few dozen bytes per unit of work.
        return (PartSpec, (self.index, self.start, self.stop, self.written))

    @property
    def n_windows(self) -> int:
        return self.stop - self.start


def dispatch_order(parts: Sequence[PartSpec]) -> list[PartSpec]:
    """The order in which to hand ``parts`` to the actors: the first as planned, then the largest first.

    The first part (one model batch, :meth:`WindowPlan.parts`) still goes first: the first forecasts and the
    first sign of trouble come after one batch. The others go largest first (longest processing time first),
    so what is left at the end is the ramp's small parts and the short remainder: the actors finish within
    about one small part of each other, where the plan's order ended on full parts and left every actor but
    the last idle for up to one full part (each actor holds one or two parts queued). Only the order changes:
    the parts, their indices and files are the plan's, so resume and fingerprints are untouched. Equal sizes
    keep the plan's order (neighbouring parts share their series' data).
    """
    if not parts:
        return []
    first, *rest = parts
    return [first, *sorted(rest, key=lambda part: -part.n_windows)]


@dataclass(frozen=True)
class WindowPlan:
    """How many windows each series has; ``offsets[s]`` is the position of series ``s``' first window."""

    counts: np.ndarray  # int64 [S]
    offsets: np.ndarray  # int64 [S + 1]
    skipped: int
    capped: int
    capped_series: tuple[str, ...]  # a few series whose n_windows was capped, for the log

    @property
    def planned(self) -> int:
        return int(self.offsets[-1])

    def parts(self, windows_per_part: int, first_part: int | None = None) -> list[PartSpec]:
        """The run's units of work: runs of consecutive windows, ``windows_per_part`` each (the last may be short).

        With ``first_part`` (one model batch), the first parts ramp up from it, doubling, to ``windows_per_part``:
        the first results (and a first sign of trouble) arrive after one batch, not after a whole part, for
        a handful of extra parts. Deterministic, so a rerun plans the same parts.
        """
        if windows_per_part < 1:
            raise ValueError(f"windows_per_part must be >= 1, got {windows_per_part}")
        sizes: list[int] = []
        size = first_part if first_part is not None else windows_per_part
        covered = 0
        while covered < self.planned:
            take = min(size, windows_per_part, self.planned - covered)
            sizes.append(take)
            covered += take
            size *= 2
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return [PartSpec(index, int(starts[index]), int(starts[index + 1])) for index in range(len(sizes))]

    def segments(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(series_index, first, last)`` slices of each series' kept origins that make up windows [start, stop)."""
        series = int(np.searchsorted(self.offsets, start, side="right")) - 1
        position = start
        while position < stop:
            series_start, series_stop = int(self.offsets[series]), int(self.offsets[series + 1])
            end = min(stop, series_stop)
            if end > position:
                yield series, position - series_start, end - series_start
            position = max(position, end)
            series += 1


def _candidate_origins(series: Series, spec: WindowSpec) -> tuple[np.ndarray, int]:
    # An origin needs at least one step of history and may sit at most one step past the data: [1, n].
    # Both modes count within that range before allocating, so an unbounded request (``--start 0001-01-01
    # --end 9999-12-31`` on minute data, or a huge ``n_windows``) costs the series' size, not billions of origins.
    n = series.n_points
    if spec.n_windows is not None:
        last = n - spec.horizon
        inside = 0 if last < 1 else min(spec.n_windows, (min(last, n) - 1) // spec.stride + 1)
        origins = last - spec.stride * np.arange(inside - 1, -1, -1, dtype=np.int64)
        return origins, spec.n_windows - inside
    if spec.start_us is not None and spec.end_us is not None:  # WindowSpec guarantees one of the two modes
        first = -(-(spec.start_us - series.start_us) // series.step_us)  # ceil: first grid step >= start
        last = min((spec.end_us - series.start_us) // series.step_us, n)
        if first < 1:  # skip the origins before the data, keeping the stride's phase
            first += -(-(1 - first) // spec.stride) * spec.stride
        return np.arange(first, last + 1, spec.stride, dtype=np.int64), 0
    return np.empty(0, dtype=np.int64), 0


def context_coverage(series: Series, origins: np.ndarray, context_length: int) -> np.ndarray:
    """Observed share of each window's context (steps before the series start count as missing)."""
    observed = np.concatenate([[0], np.cumsum(np.isfinite(series.values))])
    lo = np.maximum(origins - context_length, 0)
    return (observed[origins] - observed[lo]) / context_length


def plan_series(series: Series, spec: WindowSpec) -> SeriesPlan:
    """The kept windows of one series: candidates with observed context of at least ``min_context_coverage``.

    Pure: the driver calls it to count windows, and the actor that runs a part calls it again on the same
    series to find the part's origins, so the two always agree.
    """
    origins, capped = _candidate_origins(series, spec)
    coverage = context_coverage(series, origins, spec.context_length)
    keep = (coverage > 0) & (coverage >= spec.min_context_coverage)
    return SeriesPlan(origins[keep], int((~keep).sum()), capped)


def plan_windows(series: Iterable[Series], spec: WindowSpec) -> WindowPlan:
    """Count every series' windows: memory grows with the number of series, never with windows.

    Over the flat layout (:class:`SeriesArrays`, what the reader builds) the count is a few vector passes over
    chunks of series (:func:`plan_origins`); over any other iterable, :func:`plan_series` per series. Both give
    the same counts: they are the same arithmetic on the same integers.
    """
    if isinstance(series, FlatSeries):
        return _plan_arrays(series.arrays(0, len(series)), spec)
    counts: list[int] = []
    skipped = capped = 0
    capped_series: list[str] = []
    for one in series:
        plan = plan_series(one, spec)
        counts.append(int(plan.origins.shape[0]))
        skipped += plan.skipped
        capped += plan.capped
        if plan.capped and len(capped_series) < 3:
            capped_series.append(one.series_id)
    counts_array = np.asarray(counts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts_array)]).astype(np.int64)
    return WindowPlan(counts_array, offsets, skipped, capped, tuple(capped_series))


#: Candidate windows planned at once over the flat layout (bounds the planner's memory, not its result).
PLAN_CHUNK_WINDOWS = 1 << 21


@dataclass(frozen=True)
class _Candidates:
    series_index: np.ndarray  # int64 [n]: kept windows, series after series
    origins: np.ndarray  # int64 [n]: ascending within a series
    skipped: np.ndarray  # int64 [hi - lo]: per series, left out for context coverage
    capped: np.ndarray  # int64 [hi - lo]: per series, asked for by n_windows before any history


def _candidate_counts(arrays: SeriesArrays, spec: WindowSpec, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Per series of ``lo..hi``: (first candidate origin, number of candidates), before any filter."""
    n = arrays.lengths[lo:hi]
    if spec.n_windows is not None:
        first = n - spec.horizon - spec.stride * (spec.n_windows - 1)
        return first, np.full(hi - lo, spec.n_windows, dtype=np.int64)
    if spec.start_us is None or spec.end_us is None:  # WindowSpec guarantees one of the two modes
        return np.zeros(hi - lo, dtype=np.int64), np.zeros(hi - lo, dtype=np.int64)
    start = arrays.start_us[lo:hi]
    first = -(-(spec.start_us - start) // arrays.step_us)  # ceil: first grid step >= start
    last = (spec.end_us - start) // arrays.step_us
    # Only origins 1..n can be windows (_plan_chunk keeps no other): a range far wider than the data (0001 to
    # 9999) is clipped to them here, on the stride's grid, instead of listing every step of the range.
    first = first + spec.stride * np.maximum(-(-(1 - first) // spec.stride), 0)
    last = np.minimum(last, n)
    return first, np.maximum((last - first) // spec.stride + 1, 0)


def _plan_chunk(arrays: SeriesArrays, spec: WindowSpec, lo: int, hi: int) -> _Candidates:
    """:func:`plan_series` for series ``lo..hi`` at once: the same integers, in vector passes."""
    first, count = _candidate_counts(arrays, spec, lo, hi)
    local = np.repeat(np.arange(hi - lo, dtype=np.int64), count)
    starts = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    rank = np.arange(local.size, dtype=np.int64) - np.repeat(starts, count)
    origins = np.repeat(first, count) + spec.stride * rank
    n = arrays.lengths[lo:hi]
    inside = (origins >= 1) & (origins <= n[local])  # at least one step of history, at most one past the data
    capped = np.bincount(local[~inside], minlength=hi - lo) if spec.n_windows is not None else np.zeros(hi - lo)
    local, origins = local[inside], origins[inside]
    base_point = int(arrays.offsets[lo])
    observed = np.concatenate([[0], np.cumsum(np.isfinite(arrays.values[base_point : int(arrays.offsets[hi])]))])
    base = arrays.offsets[lo:hi][local] - base_point
    coverage = (
        observed[base + origins] - observed[base + np.maximum(origins - spec.context_length, 0)]
    ) / spec.context_length
    keep = (coverage > 0) & (coverage >= spec.min_context_coverage)
    return _Candidates(
        local[keep] + lo,
        origins[keep],
        np.bincount(local[~keep], minlength=hi - lo).astype(np.int64),
        np.asarray(capped, dtype=np.int64),
    )


def _chunks(arrays: SeriesArrays, spec: WindowSpec, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """``lo..hi`` cut into runs of series with at most about :data:`PLAN_CHUNK_WINDOWS` candidates each."""
    _, count = _candidate_counts(arrays, spec, lo, hi)
    ends = np.cumsum(count)
    position = lo
    while position < hi:
        done = int(ends[position - lo - 1]) if position > lo else 0
        stop = int(np.searchsorted(ends, done + PLAN_CHUNK_WINDOWS, side="right")) + lo
        stop = min(max(stop, position + 1), hi)
        yield position, stop
        position = stop


def plan_origins(arrays: SeriesArrays, spec: WindowSpec, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept windows of series ``lo..hi`` as (series index, origin index) arrays, in the run's order."""
    found = [_plan_chunk(arrays, spec, a, b) for a, b in _chunks(arrays, spec, lo, hi)]
    if not found:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate([f.series_index for f in found]), np.concatenate([f.origins for f in found])


def _plan_arrays(arrays: SeriesArrays, spec: WindowSpec) -> WindowPlan:
    counts, skipped, capped = [], 0, []
    for lo, hi in _chunks(arrays, spec, 0, len(arrays)):
        chunk = _plan_chunk(arrays, spec, lo, hi)
        counts.append(np.bincount(chunk.series_index - lo, minlength=hi - lo).astype(np.int64))
        skipped += int(chunk.skipped.sum())
        capped.append(chunk.capped)
    counts_array = np.concatenate(counts) if counts else np.empty(0, dtype=np.int64)
    capped_array = np.concatenate(capped) if capped else np.empty(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts_array)]).astype(np.int64)
    capped_series = tuple(arrays.series_ids[int(i)] for i in np.flatnonzero(capped_array)[:3])
    return WindowPlan(counts_array, offsets, skipped, int(capped_array.sum()), capped_series)


def batches(segments: Sequence[tuple[int, np.ndarray]], rows_per_batch: int) -> Iterator[PlannedBatch]:
    """Cut ``(series_index, origins)`` segments into model batches of ``rows_per_batch`` windows."""
    if not segments:
        return
    series_index = np.concatenate([np.full(len(origins), s, dtype=np.int64) for s, origins in segments])
    origin_index = np.concatenate([np.asarray(origins, dtype=np.int64) for _, origins in segments])
    yield from batches_of(series_index, origin_index, rows_per_batch)


def batches_of(series_index: np.ndarray, origin_index: np.ndarray, rows_per_batch: int) -> Iterator[PlannedBatch]:
    """Cut parallel (series index, origin index) arrays into model batches of ``rows_per_batch`` windows."""
    for number, start in enumerate(range(0, len(origin_index), rows_per_batch)):
        stop = start + rows_per_batch
        # Copies, not views: a batch must not keep the whole part's arrays alive (or ship them, if pickled).
        yield PlannedBatch(number, series_index[start:stop].copy(), origin_index[start:stop].copy())


# --- window ids ---------------------------------------------------------------------------------------------

_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def series_key(series_id: str, run_fingerprint: str) -> int:
    """A 64-bit digest of (series id, run configuration): hashed once per series, not per window."""
    digest = hashlib.blake2b(f"{series_id}|{run_fingerprint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def window_id_array(keys: np.ndarray, origins_us: np.ndarray) -> pa.StringArray:
    """Stable window ids, 16 hex digits: splitmix64 of (series key, origin), vectorised over windows.

    ``keys`` holds each window's :func:`series_key`. Hashing a string per window in Python cost the driver
    more than anything else per batch (measured); this is a few numpy passes, and the hex text is built
    straight into one Arrow buffer.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    origins = np.asarray(origins_us, dtype=np.int64)
    if keys.shape != origins.shape:
        raise ValueError(f"{keys.shape[0]} series keys for {origins.shape[0]} origins")
    with np.errstate(over="ignore"):
        z = keys ^ (origins.view(np.uint64) * _GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * _MIX_1
        z = (z ^ (z >> np.uint64(27))) * _MIX_2
        z = z ^ (z >> np.uint64(31))
    nibbles = z.astype(">u8").view(np.uint8).reshape(-1, 8)
    text = np.empty((len(z), 16), dtype=np.uint8)
    text[:, 0::2] = _HEX[nibbles >> 4]
    text[:, 1::2] = _HEX[nibbles & 0x0F]
    offsets = np.arange(0, 16 * len(z) + 1, 16, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(z), [None, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())])


def window_ids(series_ids: Sequence[str] | np.ndarray, origins_us: np.ndarray, run_fingerprint: str) -> list[str]:
    """The ids of windows given as (series id, origin) pairs; for reports and tests (the hot path uses arrays)."""
    ids = list(series_ids)
    if len(ids) != len(origins_us):
        raise ValueError(f"{len(ids)} series ids for {len(origins_us)} origins")
    cache: dict[str, int] = {}
    keys = np.asarray([cache.setdefault(s, series_key(s, run_fingerprint)) for s in ids], dtype=np.uint64)
    return list(window_id_array(keys, np.asarray(origins_us, dtype=np.int64)).to_pylist())
