"""Issue 42: adding a metric to the registry is enough for it to reach every output.

A throwaway metric (twice the MAE, made primary) is registered for this module only, then ``distributed-onnx
backtest`` runs on the bundled data (one series, the bundled checkpoint, the shared real local Ray) and
``distributed-onnx score --backtest`` scores its forecasts logged as a service would have answered them
(tests/test_report_cli.py's runs). The metric must be in the metrics table (pooled and fev convention), the
leaderboard (its value, interval and skill), the verdict and the score by origin (it is primary), both reports
and both CLI headlines, with the values of 2 x MAE where MAE has them.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import start_test_ray
from test_report_cli import FLAGS, MODEL, _log
from throwaway_metric import Throwaway

from distributed_onnx import cli
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.resources import REFERENCE_DATASET

NAME = Throwaway.name


@pytest.fixture(scope="module")
def throwaway() -> Iterator[registry.Metric]:
    """The throwaway metric, registered while this module's tests run."""
    metric = registry.register(Throwaway())
    try:
        yield metric
    finally:
        registry.unregister(metric.name)


def _cli(argv: list[str]) -> dict[str, Any]:
    """Run the CLI; its headline (the JSON it prints before the ``wrote ...`` line)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    printed = out.getvalue()
    return json.loads(printed[: printed.rindex("\nwrote ")])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runs(throwaway: registry.Metric, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("onnxruntime")
    start_test_ray()
    root = tmp_path_factory.mktemp("metric_reach")
    backtest, live = root / "backtest", root / "live"
    backtest_headline = _cli(["backtest", "--output", str(backtest), *FLAGS])
    _log(backtest, root / "log")
    argv = ["score", "--forecasts", str(root / "log"), "--actuals", str(REFERENCE_DATASET), "--output", str(live)]
    score_headline = _cli([*argv, "--backtest", str(backtest)])
    yield {"backtest": backtest, "live": live, "backtest_headline": backtest_headline, "score_headline": score_headline}


def _global(folder: Path, metric: str, convention: str) -> dict[str, float]:
    table = pq.read_table(folder / "metrics.parquet")
    rows = table.filter(
        (pc.field("scope") == "global") & (pc.field("metric") == metric) & (pc.field("convention") == convention)
    )
    return {row["model"]: row["value"] for row in rows.to_pylist()}


@pytest.mark.integration
@pytest.mark.parametrize("folder", ["backtest", "live"])
def test_the_metrics_table_has_it_pooled_and_in_the_fev_convention(runs: dict[str, Any], folder: str) -> None:
    for convention in ("pooled", "fev"):
        ours, mae = _global(runs[folder], NAME, convention), _global(runs[folder], "mae", convention)
        assert ours and set(ours) == set(mae), (convention, ours, mae)
        assert all(math.isclose(ours[model], 2 * mae[model], rel_tol=1e-12) for model in ours)
    table = pq.read_table(runs[folder] / "metrics.parquet")
    scopes = set(table.filter(pc.field("metric") == NAME)["scope"].to_pylist())
    assert {"global", "series", "lead"} <= scopes


@pytest.mark.integration
@pytest.mark.parametrize("folder", ["backtest", "live"])
def test_the_leaderboard_has_its_value_interval_skill_and_tests(runs: dict[str, Any], folder: str) -> None:
    board = pq.read_table(runs[folder] / "leaderboard.parquet")
    rows = board.filter(pc.field("metric") == NAME).to_pylist()
    metric = {row["model"]: row for row in rows if row["kind"] == "metric"}
    mae = {
        row["model"]: row for row in board.filter(pc.field("metric") == "mae").to_pylist() if row["kind"] == "metric"
    }
    assert MODEL in metric and set(metric) == set(mae)
    for model, row in metric.items():
        for key in ("value", "ci_low", "ci_high"):  # the interval of a resample of 2 x MAE is 2 x MAE's
            assert math.isclose(row[key], 2 * mae[model][key], rel_tol=1e-9), (model, key, row, mae[model])
        assert row["ci_low"] < row["ci_high"]
    assert any(row["kind"] == "skill" and row["model"] == MODEL for row in rows)
    assert any(row["kind"] == "dm" for row in rows)  # primary: the Diebold-Mariano test's loss


@pytest.mark.integration
@pytest.mark.parametrize("folder", ["backtest", "live"])
def test_both_reports_show_it_with_the_verdict_by_it(runs: dict[str, Any], folder: str) -> None:
    page = (runs[folder] / "report.html").read_text()
    assert f"Best by pooled {NAME.upper()}: <b>" in page  # the verdict
    assert f"<th>{NAME.upper()}<br><span class='hint'>pooled [95%]; fev</span></th>" in page  # the leaderboard
    assert f"<tr><th>{NAME.upper()}</th>" in page  # the headline table
    assert f"{NAME.upper()} by forecast origin (each origin" in page  # the score by origin, in the primary metric
    board = page[page.index("<table class='board'>") :]
    row = board[board.index(f"<tr><th>{MODEL}</th>") : board.index("</tr>", board.index(f"<tr><th>{MODEL}</th>"))]
    last_metric = [cell for cell in row.split("<td>") if "class='fev'" in cell][-1]  # the reported order: it last
    assert re.search(r"<span class='hint'>\[.+?, .+?\]</span>", last_metric), last_metric  # with its interval


@pytest.mark.integration
def test_the_backtest_report_was_drawn_by_the_report_process(runs: dict[str, Any]) -> None:
    """The child process drew it: the metric reached it (registered there from the driver's request)."""
    summary = json.loads((runs["backtest"] / "summary.json").read_text())
    assert summary["timing"]["report_drawn_by"] == "report process"


@pytest.mark.integration
def test_both_cli_headlines_print_it(runs: dict[str, Any]) -> None:
    backtest = runs["backtest_headline"]["global"]
    assert math.isclose(
        backtest[f"{MODEL}.{NAME}"], round(2 * _global(runs["backtest"], "mae", "pooled")[MODEL], 4), abs_tol=1e-4
    )
    groups = runs["score_headline"]["global"]
    assert any(f"{MODEL}.{NAME}" in group for group in groups.values()), groups


class _Unit(Throwaway):
    """Another throwaway, first in rank, so the test holds whether or not the module's is registered."""

    name = "throwaway_unit"
    primary_rank = -2


def test_registering_makes_it_primary_and_unregistering_takes_it_back() -> None:
    before = [metric.name for metric in registry.METRICS]
    registry.register(_Unit())
    try:
        assert registry.primary(has_median=True) == _Unit.name and registry.primary(has_median=False) == "sql"
        assert _Unit.name in registry.headline() and registry.reported()[-1] == _Unit.name
        assert registry.added()[-1].name == _Unit.name
        with pytest.raises(ValueError, match="registered already"):
            registry.register(_Unit())
    finally:
        registry.unregister(_Unit.name)
    assert [metric.name for metric in registry.METRICS] == before
    with pytest.raises(ValueError, match="built-in"):
        registry.unregister("mase")
