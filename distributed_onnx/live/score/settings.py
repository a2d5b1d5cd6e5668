"""Settings of ``distributed-onnx score``: which forecast log, which actuals, where the scores go."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from distributed_onnx.bounds import MAX_STEPS
from distributed_onnx.evaluation.data.columns import ColumnSettings
from distributed_onnx.location import Location
from distributed_onnx.own_inputs import Read, Written, check_own_inputs

#: What score writes in its ``--output`` folder (its other contents are left alone).
SCORE_ENTRIES = (
    "scored",
    "metrics.parquet",
    "leaderboard.parquet",
    "failures.parquet",
    "summary.json",
    "report.html",
    "live_vs_backtest.parquet",
)


class ScoreSettings(ColumnSettings):
    """Score the forecasts a service logged against the actuals that have arrived (rerun: only what is new)."""

    label: ClassVar[str] = "score settings"

    forecasts: Location = Field(description="The forecast log (serve --forecast-log): a folder or a URL.")
    actuals: Location = Field(
        description="The actuals: an input table (.parquet or .csv, long format: series_id, timestamp, y, or the "
        "columns --id-col, --time-col and --target-col name), a path or a URL; "
        "usually the series the requests were cut from, grown by what has happened since."
    )
    output: Location = Field(
        description="Score directory, a path or a URL: scored/ (what each run scored), metrics.parquet, "
        "leaderboard.parquet, summary.json, report.html. Rerun it to score what is new."
    )
    backtest: Location | None = Field(
        default=None,
        description="A backtest's output directory (backtest --output) of the served checkpoints: the report and "
        "live_vs_backtest.parquet set live skill against its skill by lead, and flag a model whose live score "
        "falls outside its backtest's bootstrap interval. Its seasonality and context length are the defaults of "
        "--seasonality and --context-length (a different value given is refused).",
    )
    seasonality: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="Seasonal period in steps, for the baselines and MASE (default: the --backtest's, else one day).",
    )
    context_length: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="The served checkpoints' context length in steps: the seasonal-quantile baseline looks back "
        "over the seasons within it, as the backtest's does (default: the --backtest's, else the one the log "
        "records for each window's checkpoints; one season for a log that records none).",
    )

    @model_validator(mode="after")
    def _writes_no_input(self) -> ScoreSettings:
        """``--output`` never lands on what score reads (:mod:`distributed_onnx.own_inputs`): the log, the actuals,
        a ``--backtest`` folder (whose metrics.parquet and summary.json score's would replace)."""
        inputs = [Read("forecasts", self.forecasts, "folder"), Read("actuals", self.actuals)]
        if self.backtest is not None:
            inputs.append(Read("backtest", self.backtest, "folder"))
        check_own_inputs([Written("output", self.output, SCORE_ENTRIES)], inputs)
        return self
