"""A variant against its parent: does the variant's accuracy differ, by how much, and how much faster is it.

A variant is a checkpoint whose metadata names its ``parent`` (``{"name", "sha256"}``; an int8 quantization
of an fp32 export, say). When a backtest runs both, they are scored on the same pairs, so the leaderboard's
own Diebold-Mariano test of the pair (:func:`~.leaderboard.diebold_mariano`, one definition, read back from
its ``dm`` row) says whether their per-window losses differ beyond noise, and its ``metric`` rows give the
relative change of the headline metric (the test's loss: MASE, or SQL without a median). The speed ratio is
the parent's model time over the variant's, from the actors' per-model stage times of the parts computed in
this invocation (``timing.actor_stage_s``, ``model:NAME``): the same windows, the same batches, one process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.part_messages import MODEL_STAGE_PREFIX

__all__ = ["ALPHA", "variant_verdicts"]

#: The test's level: a p-value below it says the accuracies differ.
ALPHA = 0.05


def _parent_in_run(parent: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The run's model that is ``parent``: by its weights' digest, else by name."""
    for name, record in models.items():
        if record.get("sha256") and record.get("sha256") == parent.get("sha256"):
            return name
    named = parent.get("name")
    return str(named) if named in models else None


def variant_verdicts(
    models: Mapping[str, Mapping[str, Any]], board: pa.Table, stage_s: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """One verdict per variant of the run whose parent is in the run too (``models``: summary.json's)."""
    rows = board.to_pylist()
    verdicts = []
    for variant, record in models.items():
        parent_record = record.get("parent")
        if not isinstance(parent_record, Mapping):
            continue
        parent = _parent_in_run(parent_record, models)
        if parent is None or parent == variant:
            continue
        test = next((r for r in rows if r["kind"] == "dm" and r["model"] == variant and r["versus"] == parent), None)
        if test is None:
            continue
        metric = str(test["metric"])
        values = {
            r["model"]: float(r["value"])
            for r in rows
            if r["kind"] == "metric" and r["metric"] == metric and r["model"] in (variant, parent)
        }
        verdicts.append(_verdict(variant, parent, record.get("quantization"), metric, values, test, stage_s or {}))
    return verdicts


def _verdict(
    variant: str,
    parent: str,
    quantization: Any,
    metric: str,
    values: Mapping[str, float],
    test: Mapping[str, Any],
    stage_s: Mapping[str, float],
) -> dict[str, Any]:
    mine, theirs = values.get(variant, math.nan), values.get(parent, math.nan)
    change = (mine - theirs) / theirs if theirs and math.isfinite(theirs) else math.nan
    p_value, statistic = float(test["p_value"]), float(test["statistic"])
    model_s = {name: stage_s.get(f"{MODEL_STAGE_PREFIX}{name}") for name in (variant, parent)}
    speedup = (
        model_s[parent] / model_s[variant]  # type: ignore[operator]
        if model_s[parent] and model_s[variant]
        else None
    )
    differs: bool | None
    if math.isnan(p_value):
        differs = None if mine != theirs else False
        finding = "the test is undefined (identical losses or too few windows): no difference shown"
    elif p_value < ALPHA:
        differs = True
        worse = "worse" if statistic > 0 else "better"
        finding = f"the variant's accuracy differs from its parent's ({worse}; p {p_value:.3g} < {ALPHA})"
    else:
        differs = False
        finding = f"no difference in accuracy shown (p {p_value:.3g} >= {ALPHA})"
    label = metric.upper()
    text = (
        f"{variant} against its parent {parent}: pooled {label} {mine:.4g} vs {theirs:.4g} ({change:+.2%}); "
        f"Diebold-Mariano on {int(test['n'])} windows: {finding}"
    )
    if speedup is not None:
        text += f"; {speedup:.2f}x its parent's speed (model time on the same windows)"
    return {
        "variant": variant,
        "parent": parent,
        "quantization": quantization,
        "metric": metric,
        "variant_value": mine,
        "parent_value": theirs,
        "relative_change": change,
        "dm_statistic": statistic,
        "p_value": p_value,
        "n": int(test["n"]),
        "differs": differs,
        "speedup": speedup,
        "model_s": model_s,
        "verdict": text,
    }
