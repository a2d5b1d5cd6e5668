"""The report's section on variants: each against its parent, in words (:mod:`..scoring.variants`)."""

from __future__ import annotations

from html import escape
from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.scoring.variants import variant_verdicts

__all__ = ["variants_section"]


def variants_section(summary: dict[str, Any], board: pa.Table | None) -> list[str]:
    """The section's HTML (nothing when the run has no variant with its parent)."""
    if board is None or not board.num_rows:
        return []
    stage_s = (summary.get("timing") or {}).get("actor_stage_s") or {}
    verdicts = variant_verdicts(summary.get("models") or {}, board, stage_s)
    if not verdicts:
        return []
    items = "".join(  # a variant whose parent's name is in the run under another identity: said, not compared
        f"<li class='{'variant not-parent' if verdict.get('identity_differs') else 'variant'}'>"
        f"{escape(verdict['verdict'])}</li>"
        for verdict in verdicts
    )
    return ["<h2>Variants against their parents</h2>", f"<ul>{items}</ul>"]
