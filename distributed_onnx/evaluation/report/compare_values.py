"""What the report's comparison of the run's models shows, computed once before it is drawn.

Both report pages (a backtest's, :mod:`.page`, and live scoring's, once per group of checkpoints scored together)
draw the comparison (:mod:`.compare`) from this one record: how sure the run is (:mod:`..scoring.uncertainty`:
the intervals' resampling, the verdict, the score by origin), the registry's choice of metrics
(:mod:`..scoring.registry`), and each model's skill by lead and coverage of each central interval
(:class:`ModelCurves`, read off the metrics once with the page's other values: :func:`.page_values.model_curves`).
Asked here once for the whole comparison, so that drawing it is rendering only, rather than each section computing
as it is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.registry import primary, ranking, reported
from distributed_onnx.evaluation.scoring.uncertainty import Uncertainty, uncertainty


@dataclass(frozen=True)
class SkillByLead:
    """Every model's skill of ``metric`` against seasonal naive by lead (pooled), with its colour index."""

    leads: np.ndarray
    metric: str
    skills: dict[str, tuple[int, np.ndarray]]


@dataclass(frozen=True)
class ModelCurves:
    """What the comparison reads of the run's metrics (:func:`.page_values.model_curves`): the metric that ranks
    the models, the run's central intervals (widest first) with every model's coverage of each (None where not
    scored; no seasonal naive: a point forecast), and the ranking metric's skill by lead."""

    rank_metric: str
    intervals: list[tuple[float, float]]
    coverage: dict[str, list[float | None]]
    skill_by_lead: SkillByLead | None


@dataclass(frozen=True)
class Comparison:
    """Everything the comparison shows that is computed (see the module docstring)."""

    board: pa.Table
    #: The run's models in the page's order (checkpoints, then the baselines).
    models: list[str]
    uncertainty: Uncertainty | None
    #: The metric that ranks the models (:attr:`~.tables.Scores.primary`), and the primary without the median
    #: (the skill against seasonal quantiles).
    rank_metric: str
    probabilistic_metric: str
    #: The metrics that can rank (a skill column each), and the report's global metrics (a column each).
    skill_metrics: list[str]
    reported: list[str]
    #: (model, metric) -> the global value under the fev convention.
    fev: dict[tuple[str, str], float]
    #: Pairs of models (both orders) that made identical forecasts.
    same: frozenset[tuple[str, str]]
    #: The leaderboard's record of the pairs scored and left out, per model.
    pairs: dict[str, Any]
    skill_by_lead: SkillByLead | None
    #: The run's central intervals, and each model's coverage of each (None where not scored; no naive row).
    intervals: list[tuple[float, float]]
    coverage: dict[str, list[float | None]]


def comparison_values(
    board: pa.Table,
    models: Sequence[str],
    metrics: pa.Table,
    curves: ModelCurves,
    pairs: dict[str, Any],
    *,
    pair_scores: PairScores | None = None,
    step_us: int | None = None,
) -> Comparison:
    """The record :mod:`.compare` draws. ``curves``: every model's coverage and skill by lead, read off the metrics
    (:func:`.page_values.model_curves`). ``pair_scores`` and ``step_us`` give the intervals' resampling, the verdict
    and the score by origin; without them the comparison shows the leaderboard's intervals as they are."""
    sure = uncertainty(pair_scores, step_us) if pair_scores is not None and step_us else None
    same = frozenset((a, b) for group in (sure.identical if sure else []) for a in group for b in group if a != b)
    # Filtered in Arrow first: the table holds a few rows per series (millions at 100,000 series), and converting
    # every row to Python took most of the report's time there (benchmarks/results/time_to_results.md).
    global_fev = (pc.field("convention") == "fev") & (pc.field("scope") == "global")
    fev = {
        (row["model"], row["metric"]): row["value"]
        for row in metrics.filter(global_fev).select(["model", "metric", "value"]).to_pylist()
    }
    return Comparison(
        board,
        list(models),
        sure,
        curves.rank_metric,
        primary(has_median=False),
        [metric.name for metric in ranking()],
        list(reported()),
        fev,
        same,
        pairs,
        curves.skill_by_lead,
        curves.intervals,
        curves.coverage,
    )
