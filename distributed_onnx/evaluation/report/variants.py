"""The report's section on variants: each against its parent, in words (:mod:`..scoring.variants`'s verdicts, read
once with the leaderboard: :mod:`..scoring.findings`)."""

from __future__ import annotations

from html import escape

import pyarrow as pa

from distributed_onnx.evaluation.scoring.findings import LeaderboardFindings

__all__ = ["variants_section"]


def variants_section(findings: LeaderboardFindings | None, board: pa.Table | None) -> list[str]:
    """The section's HTML (nothing when the run has no variant with its parent, or an empty leaderboard)."""
    if findings is None or board is None or not board.num_rows:
        return []
    verdicts = findings.variants
    if not verdicts:
        return []
    items = "".join(  # a variant whose parent's name is in the run under another identity: said, not compared
        f"<li class='{'variant not-parent' if verdict.get('identity_differs') else 'variant'}'>"
        f"{escape(verdict['verdict'])}</li>"
        for verdict in verdicts
    )
    return ["<h2>Variants against their parents</h2>", f"<ul>{items}</ul>"]
