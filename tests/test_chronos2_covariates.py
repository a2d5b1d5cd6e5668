"""A window's past-only and categorical covariate rows equal what Chronos-2's own preprocessing builds, bit for bit.

Upstream's ``chronos.chronos2.preprocess.from_data_frame`` is given each window's own ``df`` (its context rows)
and ``future_df`` (its horizon's known-future values), as ``predict_df`` would be in a backtest; this package's
:func:`~distributed_onnx.evaluation.data.window_covariates.prepare_covariates` builds the same rows from the packed
window (category codes from :mod:`~distributed_onnx.evaluation.data.categories`). Pure logic: no Ray, no ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("chronos")
pd = pytest.importorskip("pandas")

from chronos.chronos2.preprocess import from_data_frame  # noqa: E402

from distributed_onnx.evaluation.data.categories import category_codes  # noqa: E402
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles, prepare_covariates  # noqa: E402

CONTEXT, HORIZON, WINDOWS = 24, 8, 5


def _windows(seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    width = CONTEXT + HORIZON
    target = rng.normal(10, 3, (WINDOWS, CONTEXT)).astype(np.float32)
    target[rng.random(target.shape) < 0.15] = np.nan  # gaps in the target
    daytype = rng.choice(np.array(["work", "weekend", "bridge", None], dtype=object), (WINDOWS, width))
    daytype[0, CONTEXT:] = "unseen"  # a future category the context never had: the item mean
    holiday = rng.random((WINDOWS, width)) < 0.3
    lagged = rng.normal(0, 1, (WINDOWS, width))
    return target, {"lagged": lagged, "holiday": holiday, "daytype": daytype}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_rows_equal_upstream_preprocessing(seed: int) -> None:
    target, columns = _windows(seed)
    past, known = ["lagged", "holiday"], ["daytype"]
    names = [*past, *known]
    codes = np.stack(
        [
            category_codes(pa.array(columns[name].ravel().tolist())).reshape(WINDOWS, -1)
            if name != "lagged"
            else columns[name]
            for name in names
        ],
        axis=1,
    )
    roles = CovariateRoles(past_only=len(past), categorical=(False, True, True))

    got = prepare_covariates(target, codes, CONTEXT, roles).astype(np.float32)

    stamps = pd.date_range("2024-01-01", periods=CONTEXT + HORIZON, freq="h")
    for window in range(WINDOWS):
        df = pd.DataFrame({"item_id": "w", "timestamp": stamps[:CONTEXT], "target": target[window]})
        for name in names:
            df[name] = columns[name][window, :CONTEXT]
        future_df = pd.DataFrame({"item_id": "w", "timestamp": stamps[CONTEXT:]})
        future_df["daytype"] = columns["daytype"][window, CONTEXT:]
        (prepared,) = from_data_frame(df, target_columns=["target"], prediction_length=HORIZON, future_df=future_df)
        context, future = prepared["context"].numpy(), prepared["future_covariates"].numpy()
        np.testing.assert_array_equal(got[window, :, :CONTEXT], context[1:])  # row 0 is the target
        np.testing.assert_array_equal(got[window, :, CONTEXT:], future[1:])


def test_codes_are_stable_and_null_is_a_category() -> None:
    first = category_codes(pa.chunked_array([["a", None], ["b", "a"]]))
    again = category_codes(pa.array(["b", "a"]).dictionary_encode())
    assert first[0] == first[3] == again[1] and first[2] == again[0]
    assert first[1] == -1.0 and np.isfinite(first).all()


def test_settings_take_past_covariates_and_groups_from_flags_yaml_and_api(tmp_path: Path) -> None:
    from distributed_onnx.evaluation.settings import BacktestSettings

    config = tmp_path / "run.yaml"
    config.write_text("output: run\npast_covariates: [lagged, holiday]\ngroup_by: region\nmax_group_size: 50\n")
    from_yaml = BacktestSettings.from_sources({"covariates": "temp"}, config, environment=False)
    assert from_yaml.covariate_columns == ["lagged", "holiday", "temp"]  # past-only first, as upstream orders rows
    assert (from_yaml.group_by, from_yaml.max_group_size) == ("region", 50)
    with pytest.raises(ValueError, match="both known-future and past-only"):
        BacktestSettings(output="run", covariates=["temp"], past_covariates="temp")


def test_grouped_parts_never_split_a_group() -> None:
    from distributed_onnx.evaluation.grouping import grouped_parts

    starts = np.array([0, 3, 5, 12, 13, 16])
    parts = grouped_parts(starts, windows_per_part=4)
    assert [(part.start, part.stop) for part in parts] == [(0, 3), (3, 5), (5, 12), (12, 16)]
    assert [part.index for part in parts] == [0, 1, 2, 3]
