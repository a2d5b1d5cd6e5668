"""Toto, built from ``toto-ts``'s own classes, exported, backtested, equal to its pipeline's distribution.

A small random-weight ``Toto`` is exported with ``distributed-onnx export toto --random-weights --size tiny`` (the
session's export, tests/families.py; upstream's model is the same seeded weights written as the hub's folder),
backtested through the CLI on data with gaps and histories shorter than the context, and its quantiles compared with
those of the distribution upstream's own ``TotoForecaster.forecast`` builds on each window's history (inverted
through that distribution's ``cdf``). Upstream's samples converge to the same quantiles (checked loosely: they are
random). A horizon beyond one call is refused in one line, at the backtest and the export.

Integration tier: real ONNX Runtime sessions, the shared local Ray; the model is exported once per session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("toto")

from backtest_data import read_forecasts  # noqa: E402
from families import (  # noqa: E402, F401 (data, root, series: the shared module fixtures)
    LEVELS,
    RESOLUTION_MINUTES,
    WINDOWS,
    data,
    forecast_block,
    gappy_series,
    root,
    series,
    window_contexts,
    write_gappy_dataset,
)

from distributed_onnx import cli  # noqa: E402
from distributed_onnx.export.random_weights import TOTO  # noqa: E402
from distributed_onnx.export.toto import upstream_quantiles  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]

STEPS = TOTO["tiny"]["patch_size"]  # one call: one patch


@pytest.fixture(scope="module")
def pretrained(toto_pretrained: Path) -> Path:
    """The session's tiny ``Toto`` written as the hub's folder by ``write_toto`` (tests/families.py; read-only)."""
    return toto_pretrained


@pytest.fixture(scope="module")
def toto(toto_export: Path, pretrained: Path) -> tuple[Path, Any]:
    """The session's ``export toto --from-pretrained`` of :func:`pretrained` (tests/families.py) and upstream's
    ``Toto`` loaded from the same folder."""
    from toto.model.toto import Toto

    return toto_export, Toto.load_from_checkpoint(str(pretrained)).eval()


def history(window: np.ndarray) -> np.ndarray:
    """What a user hands ``TotoForecaster.forecast`` for a window: its values from the series' first one on."""
    return window[np.flatnonzero(~np.isnan(window))[0] :]


def _backtest(weights: Path, data: Path, output: Path, *flags: str) -> int:
    return cli.main(
        ["backtest", "--data", str(data), "--output", str(output), "--checkpoint", str(weights), *WINDOWS, *flags]
    )


def test_export_writes_the_mixture_contract_and_its_parity(toto: tuple[Path, Any]) -> None:
    weights, _ = toto
    assert weights.with_suffix(".onnx.data").stat().st_size > 0
    metadata = json.loads(weights.with_suffix(".metadata.json").read_text())
    assert (metadata["model_family"], metadata["missing_value"], metadata["long_horizon"]) == ("toto", "nan", "refuse")
    assert metadata["output_distribution"] == "student_t_mixture"
    assert (metadata["output_patch_size"], metadata["horizon_patches"], metadata["context_length"]) == (
        STEPS,
        1,
        64 * STEPS,
    )
    parity = json.loads(weights.with_suffix(".parity.json").read_text())
    assert parity["calls"] == 1 and parity["missing_values"] > 0 and parity["passed"]
    assert parity["max_rel_diff"] < 1e-5, parity


def test_the_graph_unembeds_only_the_patch_it_forecasts(toto: tuple[Path, Any], tmp_path: Path) -> None:
    """Upstream unembeds every patch's token and builds the mixture at every context step; the forecast reads the
    last patch's. ONNX Runtime's profile of a call: the unembedding (``embed_dim`` -> ``patch x embed_dim``) ran
    on one token per window, not on the context's 64."""
    from profiles import product_outputs, tokens_through

    weights, _ = toto
    context_length = json.loads(weights.with_suffix(".metadata.json").read_text())["context_length"]
    windows = np.full((3, context_length), np.nan, dtype=np.float32)
    for row, values in enumerate(gappy_series().values()):  # shorter than the context: NaN before each series
        windows[row, -len(values) :] = values
    shapes = product_outputs(weights, {"context": windows}, tmp_path)
    assert tokens_through(shapes, STEPS * TOTO["tiny"]["embed_dim"], rows=3) == [1], shapes


def test_backtest_equals_the_distribution_of_its_forecaster_on_each_history(
    toto: tuple[Path, Any], data: Path, series: dict[str, np.ndarray], tmp_path: Path
) -> None:
    """Every window's history is shorter than the context (4096 steps at the published patch, 64 patches here),
    as most are: ``TotoForecaster.forecast`` given it pads it to whole patches only, and its time-wise attention
    has no padding mask. The graph attends to no patch before the history's first, so the backtest equals the
    forecaster on each window's own history (from its first value), gaps inside it masked."""
    weights, model = toto
    assert _backtest(weights, data, tmp_path / "run", "--horizon", str(STEPS)) == 0
    forecasts = read_forecasts(tmp_path / "run")
    context_length = json.loads(weights.with_suffix(".metadata.json").read_text())["context_length"]
    windows = window_contexts(series, forecasts, context_length)
    histories = [history(row) for row in windows["context"]]
    assert len(histories) == 9 and max(len(each) for each in histories) < context_length - 2 * STEPS
    assert any(np.isnan(each).any() for each in histories)  # gaps inside the histories too

    ours = forecast_block(forecasts, windows["window_ids"], STEPS, LEVELS)
    theirs = np.concatenate(
        [upstream_quantiles(model, each[None], STEPS, LEVELS, RESOLUTION_MINUTES) for each in histories]
    )
    scale = float(np.abs(theirs).max())
    # Measured: max abs diff 3.5e-4 at values up to 176 (2.0e-6 of the largest: float32 rounding over 64 patches);
    # the graph that attended to the padding before the history was off by up to 2.4e-2 of the largest value.
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale)

    # What upstream's sampling estimates: its sample quantiles approach the same values (loosely: they are random).
    from toto.data.util.dataset import MaskedTimeseries
    from toto.inference.forecaster import TotoForecaster

    torch.manual_seed(0)
    sampled = []
    for each in histories:
        context = torch.from_numpy(each)[None]
        observed = ~torch.isnan(context)
        length = context.shape[-1]
        inputs = MaskedTimeseries(
            series=torch.where(observed, context, torch.zeros_like(context))[:, None, :],
            padding_mask=observed[:, None, :],
            id_mask=torch.zeros((1, 1, length), dtype=torch.int),
            timestamp_seconds=torch.zeros((1, 1, length), dtype=torch.int),
            time_interval_seconds=torch.full((1, 1), RESOLUTION_MINUTES * 60, dtype=torch.int),
        )
        drawn = TotoForecaster(model.model).forecast(inputs, STEPS, num_samples=1000, samples_per_batch=1000).samples
        assert drawn is not None
        sampled.append(drawn[:, 0].numpy())
    by_samples = np.quantile(np.concatenate(sampled), LEVELS, axis=-1).transpose(1, 2, 0)  # [W, H, Q]
    off = np.abs(by_samples - ours) / (theirs[..., -1:] - theirs[..., :1])  # in units of the 0.1-0.9 spread
    # Measured at 1000 samples: mean 0.014, max 0.15 (on the windows' histories; 0.016 and 0.13 on the NaN-padded
    # windows before); at 4000 samples every value was within 0.1.
    assert off.mean() < 0.04 and off.max() < 0.3, (off.mean(), off.max())


def test_a_horizon_beyond_one_call_is_refused_in_one_line(
    toto: tuple[Path, Any], pretrained: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights, _ = toto
    capsys.readouterr()
    assert _backtest(weights, data, tmp_path / "run", "--horizon", str(STEPS + 1)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and f"horizon {STEPS + 1}" in err and "sampling paths" in err, err
    assert not list((tmp_path / "run").glob("forecasts/*/part-*.parquet"))

    argv = ["export", "toto", "--from-pretrained", str(pretrained), "--output", str(tmp_path / "long.onnx")]
    assert cli.main([*argv, "--horizon", str(2 * STEPS), "--resolution-minutes", "30"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "sampling paths" in err, err
    assert not (tmp_path / "long.onnx").exists()
