"""What the leaderboard says beyond its rows: the realized twins' gaps (``--compare-realized``,
:mod:`.realized_gap`) and the variants' verdicts against their parents (:mod:`.variants`).

Read once, where the leaderboard is built (the report process, or the driver when it draws the report itself), into
one record: the page draws it and ``summary.json`` records it, so both say the same and neither reads the board
again (the verdicts were computed twice, once for each).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.scoring.realized_gap import realized_gaps
from distributed_onnx.evaluation.scoring.variants import variant_verdicts

__all__ = ["LeaderboardFindings", "leaderboard_findings"]


@dataclass(frozen=True)
class LeaderboardFindings:
    """The leaderboard's findings (see the module docstring)."""

    #: Per model with a realized twin, its gap and the test (None: the run did not compare realized covariates).
    realized_comparison: list[dict[str, Any]] | None
    #: One verdict per variant whose parent is in the run (or whose parent's name is, under another identity).
    variants: list[dict[str, Any]]

    def add_to(self, summary: dict[str, Any]) -> None:
        """Record them in ``summary`` (summary.json): ``covariates.realized_comparison``, ``variants``. Added after
        the report was drawn: the page shows the summary as it stood then, and these in their own sections."""
        if self.realized_comparison is not None:
            summary["covariates"]["realized_comparison"] = self.realized_comparison
        if self.variants:
            summary["variants"] = self.variants


def leaderboard_findings(
    board: pa.Table, models: Mapping[str, Mapping[str, Any]], stage_s: Mapping[str, float] | None, realized: bool
) -> LeaderboardFindings:
    """The findings of ``board`` for the run's ``models`` (summary.json's), with the actors' per-model stage times
    (``stage_s``: the variants' speed); ``realized``: whether the run has realized twins (``--compare-realized``)."""
    return LeaderboardFindings(realized_gaps(board) if realized else None, variant_verdicts(models, board, stage_s))
