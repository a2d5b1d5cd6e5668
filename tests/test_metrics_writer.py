"""Unit tier: ``metrics.parquet`` written a block of series at a time equals the whole table, and the report's
per-series values computed from the sums equal those of the table's series rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from references import UnitSums, unit_rows

from distributed_onnx.evaluation.driver.merge import RunSums
from distributed_onnx.evaluation.outputs import METRICS
from distributed_onnx.evaluation.report.tables import Scores
from distributed_onnx.evaluation.scoring.pairs import BASELINES, SEASONAL_NAIVE, PairScores
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.location import Location

QUANTILES = [0.1, 0.25, 0.5, 0.75, 0.9]
HORIZON = 4


def _scores(n_series: int = 23, seed: int = 0) -> PairScores:
    """Two checkpoints and the baselines over ``n_series`` series (ids not in sorted order of arrival), two
    batches, with missing actuals, a series with none observed, all-zero actuals (WQL undefined) and a few
    unscaled windows: every kind of row a series can have or lack."""
    rng = np.random.default_rng(seed)
    scores = PairScores(["m1", "m2", *BASELINES], QUANTILES, HORIZON)
    ids = np.asarray([f"s{(7 * i) % n_series:03d}" for i in range(n_series)])
    for batch in range(2):
        series = np.repeat(ids, 2)
        n = series.size
        actual = 10.0 + rng.normal(0, 3, (n, HORIZON))
        actual[rng.random((n, HORIZON)) < 0.15] = np.nan
        actual[series == ids[0]] = np.nan  # nothing observed: no row of that series at all
        actual[series == ids[1]] = 0.0  # every actual zero: WQL is NaN, its row kept
        noise = rng.normal(0, 2, (n, HORIZON, 1))
        forecasts = {name: actual[..., None] + noise * (k + 1) + np.asarray(QUANTILES) - 0.5
                     for k, name in enumerate(scores.models)}  # fmt: skip
        forecasts = {name: np.nan_to_num(values, nan=10.0) for name, values in forecasts.items()}
        scale = rng.uniform(0.5, 2.0, n)
        scale[rng.random(n) < 0.1] = np.nan
        origins = np.full(n, batch * 3_600_000_000, dtype=np.int64)
        window_ids = np.asarray([f"w{batch}-{i}" for i in range(n)])
        scores.update(series, origins, window_ids, actual, forecasts, scale)
    return scores


@pytest.mark.parametrize("series_per_table", [1, 3, 7, 22, 23, 1000])
def test_metrics_written_a_block_of_series_at_a_time_equal_the_whole_table(
    tmp_path: Path, series_per_table: int
) -> None:
    scores = _scores()
    whole = scores.to_table()

    run_wide = RunSums(QUANTILES, HORIZON).write_metrics(Location(tmp_path), scores, series_per_table)

    written = pq.read_table(tmp_path / METRICS)
    assert written.schema.equals(whole.schema)
    assert_same_table(written, whole)  # same rows, same order, same values (bit for bit)
    assert np.isnan(whole.column("value").to_numpy()).any()  # a NaN value (WQL), which Arrow's equals calls unequal
    assert_same_table(run_wide, whole.filter(pc.field("scope") != "series"))
    assert set(run_wide.column("scope").to_pylist()) == {"global", "lead"}
    # The same rows built without the series block: what the report gets before metrics.parquet is written.
    assert_same_table(RunSums(QUANTILES, HORIZON).run_wide(scores), run_wide)


def test_the_whole_table_series_rows_are_the_per_unit_definition() -> None:
    """The series block of the chunked path against :func:`unit_rows`, the plain definition for one unit."""
    scores = _scores(n_series=9)
    accumulator = scores.pooled["m1"]
    table = _series_rows(scores.to_table(), "m1")
    order = accumulator.sorted_series()
    expected = []
    for sid, row in zip(order.ids, order.rows.tolist(), strict=True):
        sums = {name: values[row] for name, values in accumulator.series_sums().items()}
        for metric, level, value, n in unit_rows(UnitSums(**sums), QUANTILES, accumulator.intervals, True):
            expected.append((sid, metric, level, value, n))
    got = [(r["series_id"], r["metric"], r["quantile"], r["value"], r["n"]) for r in table]
    assert len(got) == len(expected)
    for (sid, metric, level, value, n), (esid, emetric, elevel, evalue, en) in zip(got, expected, strict=True):
        assert (sid, metric, level, n) == (esid, emetric, elevel, en)
        assert value == pytest.approx(evalue, nan_ok=True, rel=1e-12)


def assert_same_table(got: pa.Table, expected: pa.Table) -> None:
    """Equal rows with values equal bit for bit (Arrow's ``equals`` takes NaN for unequal: WQL is NaN here)."""
    assert got.num_rows == expected.num_rows
    assert got.drop_columns(["value"]).equals(expected.drop_columns(["value"]))
    bits = [table.column("value").to_numpy().view(np.int64) for table in (got, expected)]
    assert np.array_equal(*bits)


def _series_rows(table: pa.Table, model: str) -> list[dict[str, Any]]:
    return table.filter((pc.field("scope") == "series") & (pc.field("model") == model)).to_pylist()


def test_per_series_values_from_the_sums_equal_those_of_the_tables_series_rows() -> None:
    scores = _scores()
    table = scores.to_table()
    from_table = Scores(table)
    from_sums = Scores(table.filter(pc.field("scope") != "series"), SeriesScores(scores))

    assert list(from_sums.series_ids) == list(from_table.series_ids)
    assert len(from_table.series_ids) == 22  # the series with nothing observed has no MAE row
    for model in scores.models:
        assert np.array_equal(from_sums.series_counts(model), from_table.series_counts(model))
        for metric, level in [("mase", None), ("wql", None), ("mae", None), ("sql", None), ("rmse", None),
                              ("coverage", 0.1), ("coverage", 0.25), ("pinball", 0.75), ("nope", None)]:  # fmt: skip
            got = from_sums.series_values(model, metric, level)
            expected = from_table.series_values(model, metric, level)
            assert np.array_equal(got, expected, equal_nan=True), (model, metric, level)
    assert from_sums.value("m2", "mase", series="s005") == from_table.value("m2", "mase", series="s005")
    assert from_sums.value(SEASONAL_NAIVE, "wql") == from_table.value(SEASONAL_NAIVE, "wql")
    picked = SeriesScores(scores).values_of("m1", "mase", ["s003", "s000", "missing"])
    mase = dict(zip(from_table.series_ids, from_table.series_values("m1", "mase"), strict=True))
    assert picked == {sid: mase[sid] for sid in ("s003", "s000") if sid in mase and np.isfinite(mase[sid])}
