"""Live against backtest: each served model's live skill set beside its backtest's, by lead, and flagged when off.

``score --backtest RUN`` reads a finished backtest's outputs (``summary.json``, ``metrics.parquet``,
``leaderboard.parquet``) and, for each logged model the backtest also scored, writes ``live_vs_backtest.parquet``:
one row per (model, metric) over all leads and one per (model, metric, lead), with the live and backtest values,
their skill against seasonal naive (``1 - model / seasonal naive``, each on its own pairs), the pairs behind each,
and the backtest's bootstrap interval. The metrics are the backtest report's skill by lead (the skill metrics of
:func:`~.scoring.registry.per_checkpoint`: MASE, or SQL when the median is not forecast, and WQL), ``pooled``
convention, the same definitions and code (:class:`~.scoring.pairs.PairScores`).

A model's live numbers here are all its scored live windows of the backtest's horizon and quantile levels,
whatever checkpoints they were scored with: the groups of :mod:`.join` hold the same model's windows on
different common pairs (alone, or with a shadow), and their sums merge exactly (per series and per lead), with
both baselines merged over the same pairs, so its skill is still "the model and seasonal naive on the same
pairs". Windows of another horizon or other levels are left out, with a warning: MASE over leads 1..h and WQL
over other levels are not the backtest's numbers.

**The flag: overall, not by lead.** A model is flagged when its live score over all leads lies outside the 95%
bootstrap interval over series that the backtest already computed for that metric (``leaderboard.parquet``,
``kind = metric``: :mod:`~.scoring.leaderboard`, 1,000 resamples, seed 123), in either direction (worse:
drift or a wrong checkpoint; better: worth a look too, e.g. a backtest that was too hard or leaked). Not by lead,
for two reasons: the backtest keeps per-series sums over all leads and per-lead sums over all series, not per
(series, lead), so a by-lead interval over series would mean re-reading every forecast; and one test per lead
at 95% would flag about one lead in twenty of a healthy model by chance (five of 96 leads). The by-lead rows are
there to read *where* a flagged model departs. The interval is the backtest's sampling uncertainty, not the
live sample's: on few live series a healthy model can land outside it; the pairs columns say how much each
number rests on.

A served model the backtest did not score, or that has no comparable live window yet, is a warning naming it
(never an error): the others are still compared. A directory that is not a backtest's output is
:class:`~distributed_onnx.errors.NotABacktestError`, before ``score`` writes anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.errors import NotABacktestError
from distributed_onnx.evaluation.outputs import LEADERBOARD, METRICS
from distributed_onnx.evaluation.scoring.pairs import BASELINES, SEASONAL_NAIVE, PairScores
from distributed_onnx.evaluation.scoring.registry import POOLED, per_checkpoint, skill
from distributed_onnx.live.score.join import GroupKey
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE

SUMMARY = "summary.json"
#: Relative slack when testing "outside the interval": live and backtest sums of the same pairs, added in
#: another order, differ in the last bits, and an interval over one series has no width.
TOLERANCE = 1e-9
_METRIC_COLUMNS = {"model", "scope", "lead", "metric", "quantile", "value", "n", "convention"}
_LEADERBOARD_COLUMNS = {"kind", "model", "metric", "convention", "value", "ci_low", "ci_high", "n"}

VERSUS_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("convention", pa.string(), nullable=False),
        pa.field("lead", pa.int32()),  # null: over all leads (the row the flag is on)
        pa.field("live", pa.float64()),
        pa.field("backtest", pa.float64()),
        pa.field("live_skill", pa.float64()),
        pa.field("backtest_skill", pa.float64()),
        pa.field("backtest_ci_low", pa.float64()),
        pa.field("backtest_ci_high", pa.float64()),
        pa.field("live_n", pa.int64()),
        pa.field("backtest_n", pa.int64()),
        pa.field("outside", pa.bool_()),  # null on lead rows: the flag is overall (module docstring)
        pa.field("direction", pa.string()),  # "worse" / "better" when outside
    ]
)


@dataclass(frozen=True)
class BacktestRun:
    """The outputs of a finished backtest that the comparison needs (read once, checked)."""

    location: Location
    models: tuple[str, ...]
    horizon: int
    quantiles: tuple[float, ...]
    metrics: pa.Table  # run-wide and per-lead rows only
    leaderboard: pa.Table
    series: int | None  # the series its bootstrap resampled (None: not recorded)

    @classmethod
    def read(cls, location: Location) -> BacktestRun:
        """Read ``location``'s outputs; :class:`NotABacktestError` naming what is missing or wrong otherwise."""
        hint = "expected the --output directory of a finished `distributed-onnx backtest`"
        local = location.local_path
        if local is not None and not local.is_dir():
            raise NotABacktestError(f"--backtest {location} is not a directory ({hint}).", key="backtest")
        names = (SUMMARY, METRICS, LEADERBOARD)
        missing = [name for name in names if not storage.is_file(storage.join(location, name))]
        if missing:
            raise NotABacktestError(
                f"--backtest {location} is not a backtest's output: it has no {', '.join(missing)} ({hint}).",
                key="backtest",
            )
        try:
            summary = json.loads(storage.read_bytes(storage.join(location, SUMMARY)))
            if isinstance(summary, dict) and {"forecasts", "actuals"} <= set(summary):
                raise NotABacktestError(
                    f"--backtest {location} holds the output of `distributed-onnx score`, not of a backtest ({hint}).",
                    key="backtest",
                )
            resolved = summary["resolved"]
            horizon = int(resolved["horizon"])
            quantiles = tuple(float(q) for q in resolved["quantiles"])
            series = None if resolved.get("series") is None else int(resolved["series"])
            if "run_fingerprint" not in summary:
                raise KeyError("run_fingerprint")
        except (ValueError, KeyError, TypeError) as exc:
            raise NotABacktestError(
                f"--backtest {location}: its {SUMMARY} is not a backtest's summary (no {exc}; {hint}).",
                key="backtest",
            ) from exc
        metrics = _read_table(location, METRICS, _METRIC_COLUMNS, hint)
        if "scored_with" in metrics.column_names:
            raise NotABacktestError(
                f"--backtest {location} holds the output of `distributed-onnx score`, not of a backtest ({hint}).",
                key="backtest",
            )
        metrics = metrics.filter(pc.not_equal(metrics["scope"], "series"))
        leaderboard = _read_table(location, LEADERBOARD, _LEADERBOARD_COLUMNS, hint)
        models = tuple(name for name in dict.fromkeys(metrics["model"].to_pylist()) if name not in BASELINES)
        return cls(location, models, horizon, quantiles, metrics, leaderboard, series)


def _read_table(location: Location, name: str, columns: set[str], hint: str) -> pa.Table:
    path = storage.join(location, name)
    try:
        table = storage.read_parquet(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise NotABacktestError(
            f"--backtest {location}: cannot read its {name} ({exc}; {hint}).", key="backtest"
        ) from exc
    lacking = sorted(columns - set(table.column_names))
    if lacking:
        raise NotABacktestError(
            f"--backtest {location}: its {name} lacks the columns {lacking} ({hint}).", key="backtest"
        )
    return table


@dataclass
class VersusBacktest:
    """The comparison: its table, the models flagged (with the metrics that are outside) and the warnings."""

    backtest: str
    table: pa.Table
    backtest_series: int | None = None
    #: Which resampling the backtest's intervals use (its leaderboard's ``resampling``; None: not recorded).
    backtest_resampling: str | None = None
    flagged: dict[str, list[str]] = field(default_factory=dict)
    compared: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps of it (``versus_backtest``)."""
        return {
            "backtest": self.backtest,
            "backtest_series": self.backtest_series,
            "backtest_resampling": self.backtest_resampling,
            "compared": self.compared,
            "flagged": self.flagged,
            "warnings": self.warnings,
        }


def compare(
    merged: Mapping[GroupKey, PairScores], backtest: BacktestRun, logged_models: Sequence[str]
) -> VersusBacktest:
    """Every logged model the backtest scored, live against backtest (module docstring); the others warned."""
    versus = VersusBacktest(str(backtest.location), VERSUS_SCHEMA.empty_table(), backtest.series, _resampling(backtest))
    records: list[dict[str, Any]] = []
    for model in sorted(set(logged_models)):
        if model not in backtest.models:
            versus.warnings.append(
                f"model {model!r} was served but the backtest {backtest.location} did not score it "
                f"(it scored {', '.join(backtest.models) or 'no checkpoint'}): not compared."
            )
            continue
        live = model_scores(merged, model, backtest.horizon, backtest.quantiles)
        if live is None:
            versus.warnings.append(
                f"model {model!r} has no scored live window of the backtest's horizon {backtest.horizon} and "
                f"quantiles {list(backtest.quantiles)} yet: not compared."
            )
            continue
        versus.compared.append(model)
        other = _pairs_elsewhere(merged, model, backtest.horizon, backtest.quantiles)
        if other:
            versus.warnings.append(
                f"model {model!r}: {other} live pairs of another horizon, other quantiles or another resolution "
                f"than the backtest's (horizon {backtest.horizon}, quantiles {list(backtest.quantiles)}) are left "
                "out of the comparison (they are in metrics.parquet)."
            )
        rows = _model_rows(model, live, backtest)
        outside = [row["metric"] for row in rows if row["outside"]]
        if outside:
            versus.flagged[model] = outside
        records += rows
    versus.table = pa.Table.from_pylist(records, schema=VERSUS_SCHEMA)
    return versus


def _resampling(backtest: BacktestRun) -> str | None:
    """The resampling of the backtest's metric intervals, from its leaderboard (older ones do not record it)."""
    board = backtest.leaderboard
    if "resampling" not in board.column_names:
        return None
    found = board.filter(pc.field("kind") == "metric")["resampling"].drop_null().unique().to_pylist()
    return str(found[0]) if len(found) == 1 else None


def model_scores(
    merged: Mapping[GroupKey, PairScores], model: str, horizon: int, quantiles: Sequence[float]
) -> PairScores | None:
    """The model and both baselines over every live group that scored it at this horizon and these levels.

    Groups of one resolution only (the one with the most pairs): a model served on two grids is two models.
    """
    keys = [key for key in merged if model in key[0] and key[1] == horizon and _same_levels(key[2], quantiles)]
    if not keys:
        return None

    resolution = max(keys, key=lambda key: _pairs(merged[key], model))[3]
    combined = PairScores([model, *BASELINES], merged[keys[0]].quantiles, horizon)
    for key in sorted(k for k in keys if k[3] == resolution):
        scores = merged[key]
        for name in combined.models:
            combined.pooled[name].merge(scores.pooled[name])
            combined.windows[name].merge(scores.windows[name])
        for reason, count in scores.excluded.items():
            combined.excluded[reason] += count
        combined.nonfinite[model] += scores.nonfinite.get(model, [])
    if not _pairs(combined, model):
        return None
    return combined


def _pairs_elsewhere(
    merged: Mapping[GroupKey, PairScores], model: str, horizon: int, quantiles: Sequence[float]
) -> int:
    """The model's scored live pairs that :func:`model_scores` leaves out (other shapes or grids)."""
    total = sum(_pairs(scores, model) for key, scores in merged.items() if model in key[0])
    used = model_scores(merged, model, horizon, quantiles)
    return total - (_pairs(used, model) if used is not None else 0)


def _pairs(scores: PairScores, model: str) -> int:
    return int(scores.pooled[model].series_sums()["pairs"].sum())


def _same_levels(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=0, abs_tol=LEVEL_TOLERANCE) for x, y in zip(a, b, strict=True)
    )


def _model_rows(model: str, live: PairScores, backtest: BacktestRun) -> list[dict[str, Any]]:
    live_metrics = live.to_table()
    live_metrics = live_metrics.filter(pc.not_equal(live_metrics["scope"], "series"))
    intervals = {
        row["metric"]: row
        for row in backtest.leaderboard.filter(
            (pc.field("kind") == "metric") & (pc.field("model") == model) & (pc.field("convention") == POOLED)
        ).to_pylist()
    }
    rows = []
    for metric in [metric.name for metric in per_checkpoint(live.has_median) if metric.skill]:
        live_values, backtest_values = _pooled(live_metrics, model, metric), _pooled(backtest.metrics, model, metric)
        live_naive = _pooled(live_metrics, SEASONAL_NAIVE, metric)
        backtest_naive = _pooled(backtest.metrics, SEASONAL_NAIVE, metric)
        interval = intervals.get(metric)
        for lead in [None, *sorted(lead for lead in backtest_values if lead is not None)]:
            ours, theirs = live_values.get(lead), backtest_values.get(lead)
            row: dict[str, Any] = {
                "model": model,
                "metric": metric,
                "convention": POOLED,
                "lead": lead,
                "live": None if ours is None else ours[0],
                "backtest": None if theirs is None else theirs[0],
                "live_skill": _skill(ours, live_naive.get(lead)),
                "backtest_skill": _skill(theirs, backtest_naive.get(lead)),
                "live_n": None if ours is None else ours[1],
                "backtest_n": None if theirs is None else theirs[1],
                "backtest_ci_low": None,
                "backtest_ci_high": None,
                "outside": None,
                "direction": None,
            }
            if lead is None and interval is not None:
                row["backtest_ci_low"], row["backtest_ci_high"] = interval["ci_low"], interval["ci_high"]
                row["outside"], row["direction"] = _outside(row["live"], interval["ci_low"], interval["ci_high"])
            rows.append(row)
    return rows


def _pooled(metrics: pa.Table, model: str, metric: str) -> dict[int | None, tuple[float, int]]:
    """``{lead or None (all leads): (value, pairs)}`` of one model's pooled metric (the quantile-free rows)."""
    chosen = metrics.filter(
        (pc.field("model") == model)
        & (pc.field("metric") == metric)
        & (pc.field("convention") == POOLED)
        & pc.field("quantile").is_null()
    )
    found: dict[int | None, tuple[float, int]] = {}
    for row in chosen.select(["scope", "lead", "value", "n"]).to_pylist():
        if row["scope"] == "global":
            found[None] = (float(row["value"]), int(row["n"]))
        elif row["scope"] == "lead":
            found[int(row["lead"])] = (float(row["value"]), int(row["n"]))
    return found


def _skill(model: tuple[float, int] | None, naive: tuple[float, int] | None) -> float | None:
    if model is None or naive is None or not naive[0] or not math.isfinite(naive[0]):
        return None
    return float(skill(model[0], naive[0]))


def _outside(value: float | None, low: float | None, high: float | None) -> tuple[bool | None, str | None]:
    """Whether ``value`` lies outside ``[low, high]`` (with :data:`TOLERANCE`), and on which side."""
    if value is None or low is None or high is None or not all(map(math.isfinite, (value, low, high))):
        return None, None
    slack = TOLERANCE * max(1.0, abs(low), abs(high))
    if value > high + slack:
        return True, "worse"  # every compared metric: lower is better
    if value < low - slack:
        return True, "better"
    return False, None
