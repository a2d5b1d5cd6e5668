"""A variant against its parent: does the variant's accuracy differ, by how much, and how much faster is it.

A variant is a checkpoint whose metadata names its ``parent`` (``{"name", "sha256", "identity"}``; an int8
quantization of an fp32 export, say). Its parent in a run is the checkpoint whose identity
(:mod:`distributed_onnx.model.identity`: the graph's sha256 and every metadata field that changes an output) is
the one the variant names (the graph's sha256 alone for a variant written before identities were recorded),
whatever its name. A checkpoint that has the parent's name or graph but another identity is not the parent: the
run says so (which fields differ, both values) and gives no verdict, rather than compare the variant against
another model as if against its parent.

When a backtest runs both, they are scored on the same pairs, so the leaderboard's own Diebold-Mariano test of
the pair (:func:`~.leaderboard.diebold_mariano`, one definition, read back from its ``dm`` row) says whether their
per-window losses differ beyond noise, and its ``metric`` rows give the relative change of the headline metric
(the test's loss: MASE, or SQL without a median). The speed ratio is
the parent's model time over the variant's, from the actors' per-model stage times of the parts computed in
this invocation (``timing.actor_stage_s``, ``model:NAME``): the same windows, the same batches, one process.

The accuracy gate a variant must pass to replace its parent (``tune``'s choice, :func:`accuracy_holds`) reads
the same verdict: the test shows no difference, or shows the variant better, or shows it worse by no more than a
margin the user accepts (the relative change of the test's metric; :data:`DEFAULT_MARGIN` unless tune is told
otherwise). The margin is there because the test answers "do they differ", not "does it matter": over thousands of
windows it finds a consistent shift of a few hundredths of a percent, which an int8 graph always has, so a gate of
"no difference shown" alone would keep every variant out on the data where speed matters most. Not when the test
could not be done (too few windows, identical losses): nothing then says the accuracy held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.part_messages import MODEL_STAGE_PREFIX
from distributed_onnx.model.identity import CheckpointIdentity, describe_differences

__all__ = ["ALPHA", "DEFAULT_MARGIN", "accuracy_holds", "variant_verdicts"]

#: The test's level: a p-value below it says the accuracies differ.
ALPHA = 0.05
#: How much worse (relative change of the test's metric, pooled) a variant may be and still replace its parent when
#: the test tells them apart: 1%, about the run-to-run spread of a retrained model's pooled MASE, far above an int8
#: graph's usual shift and far below a broken one's.
DEFAULT_MARGIN = 0.01


def _identity(record: Mapping[str, Any]) -> CheckpointIdentity | None:
    """A run's model's identity (summary.json's ``models``), or its recorded sha256 alone for an older record."""
    found = CheckpointIdentity.from_record(record.get("identity"))
    if found is None and isinstance(record.get("sha256"), str):
        return CheckpointIdentity(str(record["sha256"]), {})
    return found


def _parent_in_run(
    variant: str, parent: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]]
) -> tuple[str | None, str | None]:
    """``(the run's model that is parent, None)``; ``(None, why not)`` when a model of the parent's name or graph
    has another identity; ``(None, None)`` when the run does not hold the parent."""
    named = CheckpointIdentity.from_record(parent.get("identity"))
    others = {name: _identity(record) for name, record in models.items() if name != variant}
    for name, found in others.items():
        if found is None:
            continue
        if named is not None and not named.differences(found):
            return name, None
        if named is None and found.sha256 == parent.get("sha256"):
            return name, None
    for name, found in others.items():  # the parent's name or graph, not its identity
        if found is not None and (name == parent.get("name") or found.sha256 == parent.get("sha256")):
            recorded = named or CheckpointIdentity(str(parent.get("sha256")), {})
            compared = found if named is not None else CheckpointIdentity(found.sha256, {})
            differences = describe_differences(recorded.differences(compared), "its parent", f"the run's {name}")
            return None, (
                f"{variant} names its parent {parent.get('name')} (sha256 {str(parent.get('sha256'))[:12]}...), but "
                f"the run's {name} has another identity: {differences}. It is not {variant}'s parent, so {variant} "
                "is not compared against it as a variant"
            )
    return None, None


def variant_verdicts(
    models: Mapping[str, Mapping[str, Any]], board: pa.Table, stage_s: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """One verdict per variant of the run whose parent is in the run too (``models``: summary.json's), and for a
    variant whose parent's name or graph is in the run under another identity, what differs (``parent`` None,
    ``identity_differs`` True)."""
    rows = board.to_pylist()
    verdicts = []
    for variant, record in models.items():
        parent_record = record.get("parent")
        if not isinstance(parent_record, Mapping):
            continue
        parent, not_parent = _parent_in_run(variant, parent_record, models)
        if not_parent is not None:
            verdicts.append({"variant": variant, "parent": None, "identity_differs": True, "verdict": not_parent})
        if parent is None:
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


def accuracy_holds(verdict: Mapping[str, Any], margin: float = DEFAULT_MARGIN) -> bool:
    """Whether a variant's verdict (:func:`variant_verdicts`) lets it replace its parent: compared with its parent,
    and the test shows no difference in accuracy, or shows the variant better, or worse by at most ``margin`` (a
    relative change of the pooled metric; module docstring).

    >>> accuracy_holds({"parent": "p", "differs": False, "dm_statistic": 0.4, "relative_change": 0.002})
    True
    >>> accuracy_holds({"parent": "p", "differs": True, "dm_statistic": 2.5, "relative_change": 0.0023})  # within 1%
    True
    >>> accuracy_holds({"parent": "p", "differs": True, "dm_statistic": 2.5, "relative_change": 0.04})  # worse
    False
    >>> accuracy_holds({"parent": "p", "differs": True, "dm_statistic": 2.5, "relative_change": 0.0023}, margin=0.0)
    False
    >>> accuracy_holds({"parent": "p", "differs": None, "dm_statistic": float("nan")})  # no test: nothing says so
    False
    """
    if verdict.get("parent") is None:
        return False
    differs = verdict.get("differs")
    if differs is False:
        return True
    if differs is not True:
        return False
    if float(verdict["dm_statistic"]) < 0:  # better
        return True
    change = float(verdict.get("relative_change", math.nan))
    return math.isfinite(change) and change <= margin


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
