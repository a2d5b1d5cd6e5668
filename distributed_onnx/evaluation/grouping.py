"""``--group-by COLUMN``: the plan of a cross-learning run, where a group's windows at one origin go together.

Chronos-2 forecasts the rows that share a ``group_id`` jointly (group attention). Its pipeline offers that only
as ``cross_learning=True`` over whatever shares a batch, so its forecasts change with the batch size. Here a
group is a property of the data: the series sharing a value of a per-series column, at one origin. So that the
forecasts depend on nothing else (actors, parts, ``--rows-per-batch``, a resume), the plan is built from the
data alone:

- **Groups.** The series of each value, in series order, are cut into chunks of at most ``max_group_size``
  (upstream suggests about 100); each chunk at each origin is one *group* (the chunk's series that have a window
  there).
- **Order.** The run's window sequence is group-major: chunks in value order, then origins ascending, then the
  chunk's series in series order. The driver holds this sequence (three integers per window), where the plain
  plan holds a count per series: the cost of grouping is memory in the driver and in each actor's job.
- **Parts.** Runs of whole groups (:func:`grouped_parts`, cut at group boundaries, about ``windows_per_part``
  windows each): a group is never split between parts, so it never spans two actors or two resumes.
- **Batches.** One model call per group (:func:`grouped_batches`): the group's rows are then the whole batch, so
  its forecasts are bit for bit the same whatever else the run holds. The cost: a model call per group and
  origin (small groups mean small calls), and ``--rows-per-batch`` does not apply to such runs.

The planner's part rule lives here, apart from the default part count of plain runs
(:mod:`distributed_onnx.evaluation.planning`); each series' group is read from the data by the load stage
(:mod:`distributed_onnx.evaluation.dataset`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from distributed_onnx.evaluation.data.layout import SeriesArrays
from distributed_onnx.evaluation.data.windows import PartSpec, PlannedBatch, WindowSpec, plan_origins


@dataclass(frozen=True)
class GroupedWindows:
    """The windows of a grouped run in its group-major order, and where each group starts."""

    series_index: np.ndarray  # int64 [N]
    origin_index: np.ndarray  # int64 [N]
    group: np.ndarray  # int64 [N]: the group (chunk of series x origin) of each window, numbered in order
    starts: np.ndarray  # int64 [G + 1]: group g is windows starts[g]..starts[g + 1]

    @property
    def planned(self) -> int:
        return int(self.origin_index.shape[0])

    def windows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(series index, origin index, group) of windows ``[start, stop)`` of the sequence."""
        window_range = slice(start, stop)
        return self.series_index[window_range], self.origin_index[window_range], self.group[window_range]

    def parts(self, windows_per_part: int) -> list[PartSpec]:
        return grouped_parts(self.starts, windows_per_part)


def plan_groups(arrays: SeriesArrays, spec: WindowSpec, labels: Sequence[str], max_group_size: int) -> GroupedWindows:
    """Every window of the run in group-major order (see the module docstring); a pure function of the data."""
    n_series = len(arrays)
    series_index, origin_index = plan_origins(arrays, spec, 0, n_series)
    distinct = sorted(set(labels))
    label_code = np.asarray([distinct.index(label) for label in labels], dtype=np.int64)
    by_label = np.lexsort((np.arange(n_series), label_code))  # series in value order, then series order
    rank = np.empty(n_series, dtype=np.int64)
    sorted_codes = label_code[by_label]
    first_of_label = np.searchsorted(sorted_codes, sorted_codes, side="left")
    rank[by_label] = np.arange(n_series) - first_of_label
    chunk_key = label_code * (n_series + 1) + rank // max_group_size
    _, chunk = np.unique(chunk_key, return_inverse=True)
    chunk = chunk.ravel().astype(np.int64)
    origin_us = arrays.start_us[series_index] + origin_index * arrays.step_us
    order = np.lexsort((series_index, origin_us, chunk[series_index]))
    series_index, origin_index, origin_us = series_index[order], origin_index[order], origin_us[order]
    window_chunk = chunk[series_index]
    new_group = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        new_group[1:] = (window_chunk[1:] != window_chunk[:-1]) | (origin_us[1:] != origin_us[:-1])
    group = np.cumsum(new_group) - 1
    starts = np.concatenate([np.flatnonzero(new_group), [len(order)]]).astype(np.int64)
    return GroupedWindows(series_index, origin_index, group.astype(np.int64), starts)


def grouped_parts(starts: np.ndarray, windows_per_part: int) -> list[PartSpec]:
    """Parts of whole groups, in order: a part closes before the group that would take it past
    ``windows_per_part`` windows (a larger group is a part of its own). Deterministic: a rerun plans the same."""
    if windows_per_part < 1:
        raise ValueError(f"windows_per_part must be >= 1, got {windows_per_part}")
    ends = [int(end) for end in starts[1:]]
    parts: list[PartSpec] = []
    begin = 0
    for position, stop in enumerate(ends):
        following = ends[position + 1] if position + 1 < len(ends) else None
        if following is None or following - begin > windows_per_part:
            parts.append(PartSpec(len(parts), begin, stop))
            begin = stop
    return parts


def grouped_batches(series_index: np.ndarray, origin_index: np.ndarray, group: np.ndarray) -> Iterator[PlannedBatch]:
    """One model batch per group (see the module docstring for why not several)."""
    if not len(group):
        return
    cuts = np.flatnonzero(np.diff(group)) + 1
    bounds = np.concatenate([[0], cuts, [len(group)]])
    for number, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        rows = slice(int(lo), int(hi))
        yield PlannedBatch(number, series_index[rows].copy(), origin_index[rows].copy(), group[rows].copy())
