"""``tune``'s accuracy gate: a checkpoint and its variants backtested on the data's windows, in this process, by the
backtest's own code, for the verdict the report gives.

The backtest's plan (:func:`~.evaluation.planning.prepare`), the actors' part runner over each part in turn
(:class:`~.evaluation.actor.part.PartRunner`, as the benchmark's plain loop runs it), the driver's merge and
leaderboard, and :func:`~.evaluation.scoring.variants.variant_verdicts` on them, with the summary's own model
records (:meth:`~.evaluation.planning.RunPlan.model_records`): what ``backtest`` of both checkpoints would say about
these windows, without starting Ray or drawing a report, which would cost tune more than its few dozen windows.

The windows (:func:`gate_windows`): ``origins`` per series, one horizon apart (they do not overlap, so the test's
lag is 0), back from each series' end, over ``series`` of the data's series (all of them, or spread evenly over the
sorted ids when the budget holds fewer), so that every checkpoint's forecasts fit the gate's share of the budget.
Only ``series_id``, ``timestamp`` and ``y`` are read: tune runs no covariates.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_onnx.evaluation import run_manifest
from distributed_onnx.evaluation.actor.part import PartRunner
from distributed_onnx.evaluation.data.series_source import SeriesStore
from distributed_onnx.evaluation.data.table import read_table
from distributed_onnx.evaluation.driver.merge import RunSums
from distributed_onnx.evaluation.planning import RunPlan, prepare
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.variants import variant_verdicts
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.sums import read_done_part
from distributed_onnx.location import Location
from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

__all__ = ["MAX_ORIGINS", "MIN_ORIGINS", "GateResult", "GateWindows", "gate_windows", "run_gate"]

#: The fewest window origins a gate tests on (the test needs 3; fewer than this says little), whatever the budget.
MIN_ORIGINS = 8
#: The most origins per series: beyond them the budget goes to more series.
MAX_ORIGINS = 64
_COLUMNS = ["series_id", "timestamp", "y"]


@dataclass(frozen=True)
class GateWindows:
    """How many of the data's series the gate takes, and how many origins of each."""

    series: int
    origins: int


def gate_windows(n_series: int, affordable: int) -> GateWindows:
    """``affordable`` windows (per checkpoint) over ``n_series`` series: origins per series between
    :data:`MIN_ORIGINS` and :data:`MAX_ORIGINS`, then as many series as the rest affords (at least one).

    >>> gate_windows(1, 40), gate_windows(3, 40), gate_windows(1000, 40), gate_windows(5, 1)
    (GateWindows(series=1, origins=40), GateWindows(series=3, origins=13), GateWindows(series=5, origins=8), \
GateWindows(series=1, origins=8))
    """
    origins = min(MAX_ORIGINS, max(MIN_ORIGINS, affordable // max(n_series, 1)))
    return GateWindows(series=min(n_series, max(1, affordable // origins)), origins=origins)


@dataclass(frozen=True)
class GateResult:
    """The verdict of each variant against its parent (:func:`~.evaluation.scoring.variants.variant_verdicts`;
    none for a variant the windows could not test) and the windows they rest on."""

    verdicts: list[dict[str, Any]]
    series: int
    origins: int
    windows: int
    horizon: int
    seconds: float

    def record(self) -> dict[str, Any]:
        """The gate's windows as the tuned file records them."""
        return {
            "series": self.series,
            "origins_per_series": self.origins,
            "windows": self.windows,
            "horizon": self.horizon,
            "stride": self.horizon,
            "seconds": round(self.seconds, 3),
        }


def run_gate(
    parent: ResolvedCheckpoint,
    variants: Sequence[ResolvedCheckpoint],
    data: Location,
    affordable: int,
    options: SessionOptionsConfig,
    rows_per_batch: int,
) -> GateResult:
    """Backtest ``parent`` and ``variants`` on about ``affordable`` windows each of ``data`` (module docstring),
    with sessions of ``options``, and return each variant's verdict against ``parent``."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="distributed-onnx-tune-gate-") as folder:
        subset, chosen = _subset(data, affordable, Path(folder) / "gate-data.parquet")
        horizon = parent.metadata.horizon_length
        settings = BacktestSettings.model_validate(
            {
                "checkpoint": [parent.weights_path, *(variant.weights_path for variant in variants)],
                "data": Location(subset),
                "output": Location(Path(folder) / "run"),
                "n_windows": chosen.origins,
                "stride": horizon,
                "actors": 1,
                "rows_per_batch": rows_per_batch,
                "progress": False,
            }
        )
        plan = prepare(settings)
        run_manifest.prepare_output(settings.output, plan.run_fingerprint, {})
        stage_s = _run_parts(plan, options)
        parts = {part.index: part.n_windows for part in plan.parts()}
        sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)

        def read(index: int) -> Any:
            fingerprints = plan.model_fingerprints
            return read_done_part(
                settings.output, index, plan.run_fingerprint, parts[index], plan.spec.horizon, fingerprints
            )

        scores, unverified = sums.merge_parts(parts, read)
        if unverified:  # written by this process a moment ago: a part that does not verify is a bug
            raise RuntimeError(f"tune's accuracy gate: parts {unverified} it wrote do not verify")
        board = leaderboard(scores, plan.step_us) if plan.windows.planned else pa.table({})
        verdicts = variant_verdicts(plan.model_records(), board, stage_s) if board.num_rows else []
    return GateResult(
        verdicts=verdicts,
        series=chosen.series,
        origins=chosen.origins,
        windows=int(plan.windows.planned),
        horizon=horizon,
        seconds=time.perf_counter() - started,
    )


def _subset(data: Location, affordable: int, path: Path) -> tuple[Path, GateWindows]:
    """The data's target columns for the series the gate takes (:func:`gate_windows`), written to ``path``."""
    table = read_table(data)
    ids = pc.unique(table.column("series_id")).sort()
    chosen = gate_windows(len(ids), affordable)
    if chosen.series < len(ids):  # spread over the sorted ids: not the first few, which may be alike
        picks = np.unique(np.linspace(0, len(ids) - 1, chosen.series).round().astype(np.int64))
        table = table.filter(pc.is_in(table.column("series_id"), value_set=ids.take(pa.array(picks))))
    pq.write_table(table.select([name for name in _COLUMNS if name in table.column_names]), path)
    return path, chosen


def _run_parts(plan: RunPlan, options: SessionOptionsConfig) -> dict[str, float]:
    """Every part of ``plan`` by one in-process part runner; the stages' seconds summed (``model:NAME`` each)."""
    workers = {
        checkpoint.name: InferenceWorker.from_config(
            WorkerConfig(
                checkpoint=checkpoint.weights_path,
                providers=[CpuProvider()],
                session_options=options,
                warm_up_rows=1,
            )
        )
        for checkpoint in plan.checkpoints
    }
    stage_s: dict[str, float] = {}
    try:
        runner = PartRunner(workers, plan.job(SeriesStore.from_table(plan.table)))
        for part in plan.parts():
            for stage, seconds in runner.run(part).seconds.items():
                stage_s[stage] = stage_s.get(stage, 0.0) + seconds
    finally:
        for worker in workers.values():
            worker.close()
    return stage_s
