"""What a run says about its covariates (driver side, no Ray): vintaged or known, missing, age, and the leak.

Each covariate of a run is either *vintaged* (read from ``--covariate-data`` as known at each cutoff) or *known* (the
input table's column, fed as the exact future: perfect foresight, today's meaning). The parts' counts
(``scores/vintages-N.json``, :class:`~..data.vintages.VintageStats`) are added here in part order;
``covariate_ages.parquet`` (written by the run folder, :class:`~..outputs.RunFolder`) holds, per covariate and
lead, the age of the values the model saw, and joins ``metrics.parquet`` on ``lead``. With ``--compare-realized``
:func:`..scoring.realized_gap.realized_gaps` reads from the leaderboard how much better each model looks on the
realized covariates, and the Diebold-Mariano test of the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from distributed_onnx.evaluation.data.vintages import VintageStats

if TYPE_CHECKING:
    from distributed_onnx.evaluation.planning import RunPlan

COVARIATE_AGES_SCHEMA = pa.schema(
    [
        pa.field("covariate", pa.string(), nullable=False),
        pa.field("lead", pa.int64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("missing", pa.int64(), nullable=False),
        pa.field("age_min_steps", pa.int64()),
        pa.field("age_median_steps", pa.int64()),
        pa.field("age_max_steps", pa.int64()),
        pa.field("age_median_hours", pa.float64()),
    ]
)


@dataclass(frozen=True)
class CovariatesFound:
    """What the run found of its covariates: ``summary.json``'s ``covariates``, and ``covariate_ages.parquet``'s
    table when covariates were vintaged (None otherwise: no file is written)."""

    record: dict[str, Any]
    ages: pa.Table | None


def covariates_found(plan: RunPlan, documents: Sequence[dict[str, Any]]) -> CovariatesFound:
    """The covariates' record and ages from the vintage counts the parts wrote (``documents``, in part order, as
    :meth:`~..outputs.RunFolder.earlier_files` reads them).

    Per covariate its source (vintaged or known) and role; for a vintaged one the steps missing per lead and the
    median age per lead (hours)."""
    settings = plan.settings
    stats = None
    if plan.vintaged is not None:
        stats = VintageStats(plan.spec.horizon, plan.step_us)
        for document in documents:  # added in part order
            stats.add(VintageStats.from_json(document))
    vintaged = set(plan.vintaged.vintages.names) if plan.vintaged is not None else set()
    age_rows = stats.age_rows() if stats is not None else []
    record: dict[str, Any] = {}
    for name in settings.covariate_columns:
        entry: dict[str, Any] = {
            "source": "vintaged" if name in vintaged else "known",
            "role": "past_only" if name in settings.past_covariates else "known_future",
        }
        if name in vintaged and stats is not None and name in stats.missing:
            rows = [row for row in age_rows if row["covariate"] == name]
            entry["missing_by_lead"] = stats.missing[name]
            entry["found_by_lead"] = stats.found[name]
            entry["context_missing"] = stats.context_missing[name]
            entry["age_median_hours_by_lead"] = [row["age_median_hours"] for row in rows]
        record[name] = entry
    ages = None if stats is None else pa.Table.from_pylist(age_rows, schema=COVARIATE_AGES_SCHEMA)
    if plan.vintaged is not None:
        covariates = {
            "covariate_data": str(settings.covariate_data) if settings.covariate_data else None,
            "latency_minutes": settings.covariate_latency,
            "columns": record,
        }
        return CovariatesFound(covariates, ages)
    return CovariatesFound({"columns": record}, ages)
