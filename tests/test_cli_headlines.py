"""What ``backtest`` and ``score`` print when they finish (:mod:`distributed_onnx.cli_headlines`), as pure functions
of the metrics table's rows and summary.json: only global, pooled, non-quantile rows of the headline metrics are
printed, rounded, grouped by the checkpoints scored together for ``score``; failure rates only for models that had
requests. The CLI runs that print them are in tests/test_metric_reach.py and tests/test_report_cli.py."""

from __future__ import annotations

from typing import Any

from distributed_onnx.cli_headlines import backtest_headline, failure_headline, headline_rows, score_headline


def _row(metric: str, value: float | None, **changed: Any) -> dict[str, Any]:
    return {"scope": "global", "quantile": None, "metric": metric, "model": "m", "value": value} | changed


ROWS = [
    _row("mae", 1.234567, scored_with="a+b"),
    _row("mae", 2.0, model="n", scored_with="a+b"),
    _row("wql", 0.5, convention="pooled", scored_with="c"),
    _row("mae", 9.0, scope="series"),  # not global
    _row("wql", 9.0, quantile=0.5),  # one quantile's, not the metric's
    _row("mase", 9.0, convention="fev"),  # fev's convention: not the pooled value
    _row("mase", None),  # no value (no window scored)
    _row("coverage", 9.0),  # not a headline metric
]


def test_only_the_global_pooled_headline_rows_are_printed_rounded() -> None:
    assert [(row["model"], row["metric"]) for row in headline_rows(ROWS)] == [("m", "mae"), ("n", "mae"), ("m", "wql")]
    summary = {"windows": 12, "timing": {"windows_per_s": 3.5}}
    assert backtest_headline(summary, ROWS) == {
        "windows": 12,
        "windows_per_s": 3.5,
        "global": {"m.mae": 1.2346, "n.mae": 2.0, "m.wql": 0.5},
    }
    assert score_headline(ROWS) == {"a+b": {"m.mae": 1.2346, "n.mae": 2.0}, "c": {"m.wql": 0.5}}


def test_failure_rates_name_only_models_with_requests_and_their_non_zero_kinds() -> None:
    counts = {"requests": 4, "failure_rate": 0.333333, "failed_by_kind": {"validation": 1, "timeout": 0}}
    idle = {"requests": 0, "failure_rate": 0.0, "failed_by_kind": {"validation": 0}}
    requests = {"recorded": True, "models": {"m": counts, "idle": idle}, "unattributed": idle}
    assert failure_headline(requests) == {
        "m": {"requests": 4, "failed": {"validation": 1}, "failure_rate": 0.3333},
    }
    unknown = {"requests": 2, "failure_rate": 1.0, "failed_by_kind": {"validation": 2}}
    with_unknown = requests | {"unattributed": unknown}
    assert failure_headline(with_unknown)["(model not known)"] == {  # type: ignore[index]
        "requests": 2,
        "failed": {"validation": 2},
        "failure_rate": 1.0,
    }
    assert failure_headline({"recorded": False}) == "not recorded (a log written before failures were logged)"


def test_a_written_folder_ends_in_a_slash_unless_a_query_ends_it() -> None:
    """Attack E: an S3 run's line ended ``...&region=***/``, the slash read as part of the query."""
    from distributed_onnx.cli_headlines import folder_words
    from distributed_onnx.location import Location

    assert folder_words(Location("/tmp/run")) == "/tmp/run/"
    assert folder_words(Location("s3://b/run")) == "s3://b/run/"
    shown = folder_words(Location("s3://b/run?endpoint_override=127.0.0.1:9000&region=us-east-1"))
    assert shown.startswith("s3://b/run?") and not shown.endswith("/") and "us-east-1" not in shown
