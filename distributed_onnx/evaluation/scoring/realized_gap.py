"""The leak, read from the leaderboard: how much better each model looks on the realized covariates.

With ``--compare-realized`` every checkpoint has a twin ``NAME@realized`` run on the latest vintage of each
timestamp (perfect foresight); the leaderboard holds both and the Diebold-Mariano test between them. Read by
the driver (``summary.json``) and the report, so both say the same gap.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX


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
