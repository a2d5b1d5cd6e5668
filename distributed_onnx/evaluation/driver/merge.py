"""The driver's merge: every part's sums into the run's metrics, and the fan candidates into report windows.

Sums are added in part order whatever order the parts finished in (or in which run), so a resumed run's
``metrics.parquet`` is bit-identical to an uninterrupted one's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.evaluation.fans import FanCandidates, FanPicker, FanWindow
from distributed_onnx.evaluation.outputs import METRICS
from distributed_onnx.evaluation.scoring.metrics import METRICS_SCHEMA, SERIES_PER_TABLE
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.evaluation.scoring.registry import has_median, primary
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.evaluation.sums import IN_SAMPLE, PartSums
from distributed_onnx.location import Location

if TYPE_CHECKING:
    from distributed_onnx.evaluation.planning import RunPlan


class RunSums:
    """The sums of every verified part, by part index."""

    def __init__(self, quantiles: Sequence[float], horizon: int, models: Sequence[str] = ()) -> None:
        self._quantiles = list(quantiles)
        self._horizon = horizon
        self._models = [*models, *BASELINES]
        self._scores: dict[int, PairScores] = {}
        self._fans: dict[int, FanCandidates] = {}
        #: The in-sample windows' sums, merged by :meth:`merge_parts` (None: no checkpoint has a training end).
        self.in_sample: PairScores | None = None
        self.in_sample_windows = 0

    def add(self, part_index: int, sums: PartSums) -> None:
        self._scores[part_index] = sums.scores
        self._fans[part_index] = sums.fans

    def __len__(self) -> int:
        return len(self._fans)

    def merged(self) -> PairScores:
        """Every model's sums over every part, added in part order (bit-identical whatever order parts ran in).

        The merged sums get every series' row first (in the order the parts add them), so no part grows them.
        """
        scores = PairScores(self._models, self._quantiles, self._horizon)
        order = sorted(self._scores)
        canonical: dict[str, str] = {}  # one string per series id, whichever part and model named it
        for model in self._models:
            parts = [self._scores[index].pooled[model] for index in order]
            ids = (canonical.setdefault(sid, sid) for part in parts for sid in part.series_ids)
            scores.pooled[model].reserve(list(dict.fromkeys(ids)))
        for index in order:
            scores.merge(self._scores[index])
        return scores

    def merge_parts(
        self, indices: Iterable[int], read: Callable[[int], PartSums | None]
    ) -> tuple[PairScores, list[int]]:
        """Read each part's sums (``read``; None: it does not verify) in part order and add them as they come.

        The driver's merge: one part's sums held at a time, where holding every part until all were read (at
        100,000 series together as large as the merged sums) cost ~50 MB of its peak (benchmarks/results/
        time_to_results.md). The sums are those of :meth:`merged` over the same parts, bit for bit. Each part's
        fan candidates are kept for :meth:`fans`. Returns the merged sums and the parts that did not verify.
        """
        scores = PairScores(self._models, self._quantiles, self._horizon)
        unverified = []
        for index in sorted(indices):
            sums = read(index)
            if sums is None:
                unverified.append(index)
                continue
            scores.merge(sums.scores)
            self._fans[index] = sums.fans
            if sums.in_sample is not None:
                self.in_sample_windows += int(sums.header.get("in_sample_windows", 0))
                if self.in_sample is None:
                    self.in_sample = PairScores(self._models, self._quantiles, self._horizon)
                self.in_sample.merge(sums.in_sample)
        return scores, unverified

    def metrics_table(self) -> pa.Table:
        """The long metrics table of every checkpoint and baseline, both conventions, and the left-out counts."""
        return self.merged().to_table()

    def write_metrics(
        self, output: Location, scores: PairScores | None = None, series_per_table: int = SERIES_PER_TABLE
    ) -> pa.Table:
        """Write ``metrics.parquet`` and return its run-wide rows (every row but the series scope's).

        The file holds a few rows per series, lead, metric and quantile of every model (5.4 M rows at 100,000
        series): it is written a block of series at a time (:meth:`.PairScores.tables`), so the driver never holds
        the whole table; the report and the leaderboard read the per-series values from the sums instead
        (:mod:`..scoring.series_scores`). The file's rows are those of :meth:`.PairScores.to_table`, in its order.
        """
        run_wide: list[pa.Table] = []

        def tables() -> Iterator[pa.Table]:
            for table in (scores or self.merged()).tables(series_per_table):
                run_wide.append(table.filter(pc.not_equal(table.column("scope"), "series")))
                yield table
            in_sample = self._in_sample_rows()
            if in_sample is not None:
                run_wide.append(in_sample)
                yield in_sample

        storage.write_parquet_tables(storage.join(output, METRICS), METRICS_SCHEMA, tables())
        return pa.concat_tables(run_wide).combine_chunks()

    def run_wide(self, scores: PairScores) -> pa.Table:
        """The rows :meth:`write_metrics` returns (every scope but ``series``), built without the series block:
        what the report needs before ``metrics.parquet`` is written (:class:`PendingMetrics`)."""
        tables = list(scores.tables(with_series=False))
        in_sample = self._in_sample_rows()
        return pa.concat_tables([*tables, *([] if in_sample is None else [in_sample])]).combine_chunks()

    def _in_sample_rows(self) -> pa.Table | None:
        """The in-sample windows apart: their global rows, scope ``in_sample`` (None: no in-sample sums)."""
        if self.in_sample is None:
            return None
        table = self.in_sample.fev_and_count_rows().slice(0, 0)
        for part in self.in_sample.tables(with_series=False):
            table = pa.concat_tables([table, part.filter(pc.equal(part.column("scope"), "global"))])
        scope = pa.array([IN_SAMPLE] * table.num_rows, pa.string())
        index = table.schema.get_field_index("scope")
        return table.set_column(index, table.schema.field(index), scope)

    def fans(self) -> FanPicker:
        picker = FanPicker(self._horizon, self._quantiles)
        for index in sorted(self._fans):
            picker.add(self._fans[index])
        return picker


class PendingMetrics:
    """``metrics.parquet`` of a run's merged sums, written once when :meth:`write` is first called.

    The run stage hands it on unwritten: the report stage writes it while the report process draws the
    leaderboard and the page (:mod:`.report_process`), both after the last part; one after the other they were
    the end of every run's wait (at 40,000 series, seconds: benchmarks/results/time_to_results.md).
    """

    def __init__(self, sums: RunSums, output: Location, scores: PairScores) -> None:
        self._sums, self._output, self._scores = sums, output, scores
        self.written = False

    def write(self) -> None:
        if not self.written:
            self._sums.write_metrics(self._output, self._scores)
            self.written = True


def fan_windows(picker: FanPicker, plan: RunPlan, series_scores: SeriesScores) -> list[FanWindow]:
    """The windows the report draws: picked from the parts' candidates, history from the driver's series."""
    metric = primary(has_median(plan.quantiles))
    # Only the candidates' series need a score (the typical window is the one closest to its series' score).
    candidates = {int(index): plan.table.series[int(index)].series_id for index in picker.series_indices()}
    found = series_scores.values_of(plan.checkpoint.name, metric, list(candidates.values()))
    scores = {index: found[series_id] for index, series_id in candidates.items() if series_id in found}
    picked = picker.pick(scores)
    labels = {
        "best": f"best {metric.upper()}",
        "worst": f"worst {metric.upper()}",
        "typical": "typical",
        "latest": "latest",
    }
    others = [*plan.model_names[1:], *BASELINES]
    windows = []
    for i in range(len(picked)):
        series = plan.table.series[int(picked.series_index[i])]
        origin = int((picked.origin_us[i] - series.start_us) // series.step_us)
        context = plan.spec.context_length
        history = np.full(context, np.nan)
        lo = max(origin - context, 0)
        history[context - (origin - lo) :] = series.values[lo:origin]
        score = float(picked.score[i])
        windows.append(
            FanWindow(
                series_id=series.series_id,
                label=labels[str(picked.label[i])],
                origin_us=int(picked.origin_us[i]),
                step_us=series.step_us,
                history=history,
                actual=picked.actual[i].astype(np.float64),
                quantiles={q: picked.forecast[i, :, k].astype(np.float64) for k, q in enumerate(plan.quantiles)},
                mase=score if np.isfinite(score) else None,
                scored_by=metric,
                others={
                    name: picked.others[i, m].astype(np.float64)
                    for m, name in enumerate(others)
                    if m < picked.others.shape[1]
                },
            )
        )
    return windows
