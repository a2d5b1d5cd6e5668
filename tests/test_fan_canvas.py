"""The report's fans on one reused figure (report/plots.py FanCanvas): no fan keeps anything of the one before."""

from __future__ import annotations

import numpy as np

from distributed_onnx.evaluation.report import plots

HOUR_US = 3_600_000_000


def _fan(scale: float, origin_us: int, *, clamped: bool = False, others: bool = False) -> plots.Fan:
    rng = np.random.default_rng(int(scale))
    horizon = 24
    middle = scale * rng.normal(size=horizon)
    bands = [
        (0.1, 0.9, middle - 2 * scale, middle + 2 * scale, clamped),
        (0.3, 0.7, middle - scale, middle + scale, False),
    ]
    return plots.Fan(
        title=f"fan {scale}",
        origin_us=origin_us,
        step_us=HOUR_US,
        history=scale * rng.normal(size=96),
        actual=scale * rng.normal(size=horizon),
        bands=bands,
        median=middle,
        others=[("seasonal_naive", middle + 1)] if others else (),
    )


def test_a_fan_drawn_after_others_is_the_fan_drawn_alone() -> None:
    small = _fan(1.0, 1_700_000_000 * 1_000_000)
    large = _fan(1000.0, 1_600_000_000 * 1_000_000, clamped=True, others=True)  # other limits, dates, artists
    alone = plots.FanCanvas().draw(small)
    canvas = plots.FanCanvas()
    canvas.draw(large)
    assert canvas.draw(small) == alone  # limits, ticks and artists all the small fan's own
    assert plots.fan(small) == alone


def test_the_legend_names_what_the_fan_draws() -> None:
    entries = plots.fan_legend(_fan(1.0, 0, clamped=True, others=True))
    labels = [entry.label for entry in entries]
    assert labels == [
        "80% interval (q0.1-q0.9), clamped",
        "40% interval (q0.3-q0.7)",
        "median forecast",
        "seasonal_naive median",
        "history",
        "actual (dots)",
        "forecast origin",
    ]
    widest, narrow = entries[0], entries[1]
    assert widest.color == plots.CLAMPED_COLOR and narrow.color == plots.MODEL_COLOR
    assert widest.alpha < narrow.alpha  # the widest interval palest, as drawn
    assert [entry.kind for entry in entries[2:]] == ["line", "dashed", "line", "dotted", "dashed"]
