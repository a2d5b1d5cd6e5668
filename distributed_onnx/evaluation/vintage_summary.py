"""What a run says about its covariates (driver side, no Ray): vintaged or known, missing, age, and the leak.

Each covariate of a run is either *vintaged* (read from ``--covariate-data`` as known at each cutoff) or
*known* (the input table's column, fed as the exact future: perfect foresight, today's meaning). The parts'
counts (``scores/vintages-N.json``, :class:`~.data.vintages.VintageStats`) are added here in part order;
``covariate_ages.parquet`` holds, per covariate and lead, the age of the values the model saw, and joins
``metrics.parquet`` on ``lead``. With ``--compare-realized`` :func:`realized_gaps` reads from the leaderboard
how much better each model looks on the realized covariates, and the Diebold-Mariano test of the difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX, VintageStats
from distributed_onnx.evaluation.outputs import read_vintage_stats

if TYPE_CHECKING:
    from distributed_onnx.evaluation.plan import RunPlan

COVARIATE_AGES = "covariate_ages.parquet"
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


def merged_stats(output: storage.Location, parts: Sequence[int], horizon: int, step_us: int) -> VintageStats:
    """The vintage counts of ``parts``, added in part order (a part without its file adds nothing)."""
    merged = VintageStats(horizon, step_us)
    for index in sorted(parts):
        document = read_vintage_stats(output, index)
        if document is not None:
            merged.add(VintageStats.from_json(document))
    return merged


def covariates_record(plan: RunPlan, stats: VintageStats | None) -> dict[str, Any]:
    """``summary.json``'s ``covariates``: per covariate its source (vintaged or known) and role; for a vintaged
    one the steps missing per lead and the median age per lead (hours)."""
    settings = plan.settings
    vintaged = set(plan.vintaged.vintages.names) if plan.vintaged is not None else set()
    record: dict[str, Any] = {}
    for name in settings.covariate_columns:
        entry: dict[str, Any] = {
            "source": "vintaged" if name in vintaged else "known",
            "role": "past_only" if name in settings.past_covariates else "known_future",
        }
        if name in vintaged and stats is not None and name in stats.missing:
            rows = [row for row in stats.age_rows() if row["covariate"] == name]
            entry["missing_by_lead"] = stats.missing[name]
            entry["found_by_lead"] = stats.found[name]
            entry["context_missing"] = stats.context_missing[name]
            entry["age_median_hours_by_lead"] = [row["age_median_hours"] for row in rows]
        record[name] = entry
    if plan.vintaged is not None:
        return {
            "covariate_data": storage.redact(settings.covariate_data) if settings.covariate_data else None,
            "latency_minutes": settings.covariate_latency,
            "columns": record,
        }
    return {"columns": record}


def write_covariate_ages(output: storage.Location, stats: VintageStats) -> int:
    table = pa.Table.from_pylist(stats.age_rows(), schema=COVARIATE_AGES_SCHEMA)
    return storage.write_parquet(storage.join(output, COVARIATE_AGES), table)


def realized_gaps(leaderboard: pa.Table) -> list[dict[str, Any]]:
    """Per model with a realized twin: its primary metric as of the cutoffs and on the realized covariates, the
    gap (as-of minus realized: how much a perfect-foresight backtest flatters it) and the DM test between them."""
    rows = leaderboard.to_pylist()
    dm = {(row["model"], row["versus"]): row for row in rows if row["kind"] == "dm"}
    metric_of = {(row["model"], row["metric"]): row["value"] for row in rows if row["kind"] == "metric"}
    out = []
    for twin in sorted({row["model"] for row in rows if str(row["model"]).endswith(REALIZED_SUFFIX)}):
        model = twin.removesuffix(REALIZED_SUFFIX)
        test = dm.get((model, twin))
        if test is None:
            continue
        metric = test["metric"]
        as_of, realized = metric_of.get((model, metric)), metric_of.get((twin, metric))
        gap = None if as_of is None or realized is None else as_of - realized
        share = None if gap is None or not realized else gap / realized
        out.append(
            {
                "model": model,
                "realized": twin,
                "metric": metric,
                "as_of": as_of,
                "realized_value": realized,
                "gap": gap,
                "gap_share": share,
                "dm_statistic": _finite(test["statistic"]),
                "dm_p_value": _finite(test["p_value"]),
                "n": test["n"],
            }
        )
    return out


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
