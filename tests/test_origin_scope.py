"""The scope ``origin`` (``PairScores.origin_table``): each window origin's fev-convention score, what a per-cutoff
evaluation reports (Nixtla's ``evaluate`` by cutoff). Its mean over the origins is the metrics table's fev row."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow.compute as pc
import pytest

from distributed_onnx.evaluation.scoring.pairs import ORIGIN_SCHEMA, PairScores


def test_the_origin_scope_holds_each_origins_fev_score_and_its_mean_is_the_fev_row() -> None:
    rng = np.random.default_rng(5)
    horizon, origins = 3, [0, 1_800_000_000, 3_600_000_000]
    scores = PairScores(["model"], [0.1, 0.5, 0.9], horizon)
    for origin in origins:
        actual = rng.normal(20.0, 4.0, (2, horizon))
        if origin == origins[1]:
            actual[0] = np.nan  # an origin with one series' pairs only
        forecast = np.sort(actual[:, :, None] + rng.normal(0, 2, (2, horizon, 3)), axis=2)
        forecast = np.where(np.isnan(forecast), 0.0, forecast)
        ids = np.asarray(["a", "b"])
        scores.update(ids, np.full(2, origin), ids, actual, {"model": forecast}, np.asarray([1.5, 2.0]))
    table = scores.origin_table()
    assert table.schema.equals(ORIGIN_SCHEMA)
    mae = table.filter(pc.equal(table["metric"], "mae"))
    assert mae["origin"].to_pylist() == [datetime.fromtimestamp(us / 1e6, UTC) for us in origins]
    assert mae["n"].to_pylist() == [6, 3, 6]
    fev = {metric: (value, n) for metric, value, n in scores.windows["model"].rows()}
    assert set(fev) == set(table["metric"].to_pylist())
    for metric, (value, n) in fev.items():
        rows = table.filter(pc.equal(table["metric"], metric))
        assert rows.num_rows == 3
        assert float(np.mean(rows["value"].to_numpy())) == pytest.approx(value, rel=1e-12), metric
        assert sum(rows["n"].to_pylist()) == n
