"""Unit tier (issue 53): the report chooses its metrics from the registry only.

A throwaway metric registered as primary (tests/throwaway_metric.py: twice the MAE, ranked before MASE) must take
MASE's place everywhere the report ranks or shows the run's own metric: the per-series table ranks the series by
it and gives it value, naive and skill columns, the leaderboard's skill columns and pairwise test follow it, and
skill by lead draws it. The scores are real (:class:`PairScores`, the leaderboard, the uncertainty), on a panel whose
series differ in scale, so that ranking by the throwaway (an absolute error) and by MASE (a scaled one) give
opposite orders: a table still ranked by MASE cannot pass. Without a median the same code ranks by SQL (the
registry's primary then), on a table that lists every series.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from throwaway_metric import Throwaway

from distributed_onnx.evaluation.report.page import write_report
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.location import Location

HORIZON = 4
STEP_US = 3_600_000_000
ORIGINS = 12
#: Series -> (the models' error, the seasonal scale): small errors on a tiny scale (worst by MASE, best by an
#: absolute error), large errors on a large scale (the other way round).
PANEL = {"tiny-scale": (0.3, 0.05), "unit-scale": (1.0, 1.0), "large-scale": (3.0, 20.0)}
NAME = Throwaway.name.upper()


@pytest.fixture
def throwaway() -> Iterator[registry.Metric]:
    metric = registry.register(Throwaway())
    try:
        yield metric
    finally:
        registry.unregister(metric.name)


def _scores(quantiles: tuple[float, ...]) -> PairScores:
    rng = np.random.default_rng(11)
    scores = PairScores(["good", "bad", *BASELINES], quantiles, HORIZON)
    spread = np.linspace(-1.0, 1.0, len(quantiles))
    origins = np.arange(ORIGINS, dtype=np.int64) * HORIZON * STEP_US
    for name, (error, scale) in PANEL.items():
        actual = 100.0 + np.cumsum(rng.normal(size=(ORIGINS, HORIZON)), axis=1)
        noise = error * rng.normal(size=(ORIGINS, HORIZON, 1))
        first = np.repeat(actual[:, :1, None] + 1.5 * error, HORIZON, axis=1)
        forecasts = {
            "good": actual[:, :, None] + noise + error * spread,
            "bad": actual[:, :, None] + 3.0 * noise + error * spread,
            "seasonal_naive": first + 0 * spread,
            "seasonal_quantiles": first + 2 * error * spread,
        }
        window_ids = np.array([f"{name}-{o}" for o in range(ORIGINS)])
        scores.update(np.array([name] * ORIGINS), origins, window_ids, actual, forecasts, np.full(ORIGINS, scale))
    return scores


def _page(tmp_path: Path, quantiles: tuple[float, ...]) -> str:
    scores = _scores(quantiles)
    summary = {"model": "good", "models": {"good": {}, "bad": {}}, "pairs": scores.left_out()}
    board = leaderboard(scores, STEP_US)
    path = write_report(
        Location(tmp_path), summary, scores.to_table(), quantiles, [], board, pair_scores=scores, step_us=STEP_US
    )
    return Path(path).read_text()


def _series_table(page: str) -> tuple[list[str], list[str]]:
    """The first checkpoint's per-series table: its column heads and its series, in rank order."""
    table = page[page.index("<div class='series-table'>") :]
    table = table[: table.index("</table>")]
    return re.findall(r"<th>([^<]+)</th>", table[: table.index("</thead>")]), re.findall(
        r"<tr><td>\d+</td><th>([^<]+)</th>", table
    )


def _order(page: str, metric: str) -> list[str]:
    """The series by their value of ``metric`` in the per-series table (the column headed ``metric``), ascending."""
    heads, _ = _series_table(page)
    table = page[page.index("<div class='series-table'>") :]
    rows = re.findall(r"<tr><td>\d+</td><th>([^<]+)</th>((?:<td>[^<]*</td>)+)</tr>", table[: table.index("</table>")])
    column = heads.index(metric) - 2  # after rank and series
    values = {name: float(re.findall(r"<td>([^<]*)</td>", cells)[column]) for name, cells in rows}
    return sorted(values, key=values.__getitem__)


def test_a_registered_primary_metric_ranks_the_series_and_leads_the_skill_columns(
    throwaway: registry.Metric, tmp_path: Path
) -> None:
    page = _page(tmp_path, (0.1, 0.5, 0.9))
    heads, ranked = _series_table(page)
    assert f"<h2>Series, ranked by {NAME}</h2>" in page
    assert heads[:5] == ["rank", "series", NAME, f"{NAME} naive", f"{NAME} skill"]
    assert heads[5:] == ["MASE", "MASE naive", "MASE skill", "WQL", "WQL naive", "WQL skill", "MAE", "scored pairs"]
    # Ranked by the throwaway (an absolute error), which here is the opposite of MASE's order.
    assert ranked == _order(page, NAME) == ["tiny-scale", "unit-scale", "large-scale"]
    assert _order(page, "MASE") == ranked[::-1]
    distribution = page[page.index("<table class='distribution'>") :]
    assert [
        label for label in re.findall(r"<tr><th>([^<]+)</th><td>", distribution[: distribution.index("</table>")])
    ] == [
        NAME,
        f"{NAME} skill",
        "MASE skill",
        "WQL skill",
    ]
    # The leaderboard: the skill of every metric that can rank, the primary's first; its pairwise test.
    board = page[page.index("<table class='board'>") :]
    skill_heads = re.findall(r"<th>(\w+) skill<br><span class='hint'>fev skill vs seasonal naive</span></th>", board)
    assert skill_heads == [NAME, "MASE", "SQL"]
    assert "SQL skill<br><span class='hint'>fev skill vs seasonal quantiles</span>" in board
    assert f"<h3>Pairwise ({NAME})</h3>" in page
    # Skill by lead: the checkpoint's primary by lead, and its skill among the others'.
    assert f"{NAME} by lead" in page and f"{NAME} (lower is better)" in page and f"{NAME} skill" in page


def test_without_the_median_the_series_are_ranked_by_sql_and_all_listed(tmp_path: Path) -> None:
    """Before, the table listed the series that had an MAE (none without the median) under a MASE heading."""
    page = _page(tmp_path, (0.1, 0.25, 0.75, 0.9))
    heads, ranked = _series_table(page)
    assert "<h2>Series, ranked by SQL</h2>" in page
    assert heads == ["rank", "series", "SQL", "SQL naive", "SQL skill", "WQL", "WQL naive", "WQL skill", "scored pairs"]
    assert sorted(ranked) == sorted(PANEL) and ranked == _order(page, "SQL")
    assert "SQL by lead" in page and "SQL (lower is better)" in page
