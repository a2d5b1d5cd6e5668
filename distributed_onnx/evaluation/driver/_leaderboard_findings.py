"""What ``summary.json`` reads off the leaderboard once it is drawn: the realized twins' gaps
(``--compare-realized``: :mod:`..scoring.realized_gap`) and the variants' verdicts (:mod:`..scoring.variants`).

Apart from the summary's other parts because the leaderboard is drawn after them (the report shows the summary
as it stood then), and only for the summary.json written last."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from distributed_onnx.evaluation.scoring.realized_gap import realized_gaps
from distributed_onnx.evaluation.scoring.variants import variant_verdicts

if TYPE_CHECKING:
    from distributed_onnx.evaluation.planning import RunPlan


def add_leaderboard_findings(summary: dict[str, Any], plan: RunPlan, board: pa.Table | None) -> None:
    """Add to ``summary`` the realized twins' gaps and the variants' verdicts ``board`` (the leaderboard) gives."""
    if board is None:
        return
    if plan.realized_models:
        summary["covariates"]["realized_comparison"] = realized_gaps(board)
    verdicts = variant_verdicts(summary.get("models") or {}, board, summary["timing"].get("actor_stage_s"))
    if verdicts:
        summary["variants"] = verdicts
