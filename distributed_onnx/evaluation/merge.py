"""The driver's merge: every part's sums into the run's metrics, and the fan candidates into report windows.

Sums are added in part order whatever order the parts finished in (or in which run), so a resumed run's
``metrics.parquet`` is bit-identical to an uninterrupted one's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.evaluation.fans import FanPicker, FanWindow
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.sums import PartSums

if TYPE_CHECKING:
    from distributed_onnx.evaluation.plan import RunPlan

NAIVE_MODEL = "seasonal_naive"
METRICS = "metrics.parquet"


class RunSums:
    """The sums of every verified part, by part index."""

    def __init__(self, quantiles: Sequence[float], horizon: int) -> None:
        self._quantiles = list(quantiles)
        self._horizon = horizon
        self._parts: dict[int, PartSums] = {}

    def add(self, part_index: int, sums: PartSums) -> None:
        self._parts[part_index] = sums

    def __len__(self) -> int:
        return len(self._parts)

    def merged(self) -> tuple[MetricsAccumulator, MetricsAccumulator]:
        model = MetricsAccumulator(self._quantiles, self._horizon)
        naive = MetricsAccumulator(self._quantiles, self._horizon)
        for index in sorted(self._parts):
            model.merge(self._parts[index].model)
            naive.merge(self._parts[index].naive)
        return model, naive

    def metrics_table(self, model_name: str) -> pa.Table:
        """The long metrics table of the model and of ``seasonal_naive``."""
        model, naive = self.merged()
        return pa.concat_tables([model.to_table(model_name), naive.to_table(NAIVE_MODEL)])

    def write_metrics(self, output: storage.Location, model_name: str) -> pa.Table:
        """Write ``metrics.parquet`` (a few rows per series and lead, whatever the number of windows)."""
        metrics = self.metrics_table(model_name)
        storage.write_parquet(storage.join(output, METRICS), metrics)
        return metrics

    def fans(self) -> FanPicker:
        picker = FanPicker(self._horizon, self._quantiles)
        for index in sorted(self._parts):
            picker.add(self._parts[index].fans)
        return picker


def fan_windows(sums: RunSums, plan: RunPlan, metrics: pa.Table) -> list[FanWindow]:
    """The windows the report draws: picked from the parts' candidates, history from the driver's series."""
    index = plan.table.index_of()  # from the ids alone: no series object per series
    metric = "mase" if any(abs(q - 0.5) < 1e-9 for q in plan.quantiles) else "sql"
    wanted = (
        (pc.field("scope") == "series") & (pc.field("metric") == metric) & (pc.field("model") == plan.checkpoint.name)
    )
    rows = metrics.filter(wanted).select(["series_id", "value"]).to_pydict()
    series_scores = {
        index[series_id]: value
        for series_id, value in zip(rows["series_id"], rows["value"], strict=True)
        if series_id in index
    }
    picked = sums.fans().pick(series_scores)
    labels = {
        "best": f"best {metric.upper()}",
        "worst": f"worst {metric.upper()}",
        "typical": "typical",
        "latest": "latest",
    }
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
            )
        )
    return windows
