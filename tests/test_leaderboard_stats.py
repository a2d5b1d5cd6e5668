"""The leaderboard's statistics against independent computations (pure numpy and scipy.stats; no Ray, no ORT).

The Diebold-Mariano test with the Harvey-Leybourne-Newbold correction reduces, at lag 0, to a one-sample
t-test of the loss differential: ``scipy.stats.ttest_1samp`` is the reference there. At a positive lag the
reference is the formula written out here from the papers, term by term (autocovariances by explicit sums).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from distributed_onnx.evaluation.scoring.leaderboard import _gmean_point, _with_interval, diebold_mariano


def _differential(n: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loss_b = rng.gamma(2.0, 1.0, n)
    # An MA(2) error makes neighbouring differentials correlated, as overlapping multi-step forecasts do.
    noise = rng.normal(size=n + 2)
    loss_a = loss_b + shift + noise[2:] + 0.6 * noise[1:-1] + 0.3 * noise[:-2]
    return loss_a, loss_b


@pytest.mark.parametrize(("n", "shift"), [(12, 0.0), (50, 0.4), (400, -0.1)])
def test_diebold_mariano_at_lag_zero_is_the_one_sample_t_test(n: int, shift: float) -> None:
    loss_a, loss_b = _differential(n, seed=n, shift=shift)
    statistic, p_value, count = diebold_mariano(loss_a, loss_b, lag=0)
    reference = stats.ttest_1samp(loss_a - loss_b, 0.0)
    assert count == n
    assert statistic == pytest.approx(reference.statistic, rel=1e-12)
    assert p_value == pytest.approx(reference.pvalue, rel=1e-9)


def test_diebold_mariano_at_a_positive_lag_follows_the_hln_formula() -> None:
    loss_a, loss_b = _differential(200, seed=7, shift=0.15)
    lag = 3
    d = loss_a - loss_b
    n = d.size
    mean = sum(d) / n
    gamma = [sum((d[t] - mean) * (d[t - k] - mean) for t in range(k, n)) / n for k in range(lag + 1)]
    long_run = gamma[0] + 2 * sum(gamma[1:])
    assert long_run > 0  # the rectangular window applies (no Bartlett fall-back) on this draw
    h = lag + 1
    dm = mean / math.sqrt(long_run / n)
    hln = dm * math.sqrt((n + 1 - 2 * h + h * (h - 1) / n) / n)
    expected_p = 2 * stats.t.sf(abs(hln), df=n - 1)

    statistic, p_value, count = diebold_mariano(loss_a, loss_b, lag=lag)

    assert count == n
    assert statistic == pytest.approx(hln, rel=1e-10)
    assert p_value == pytest.approx(expected_p, rel=1e-8)
    assert p_value < 0.05  # the shift is real: the test sees it


def test_diebold_mariano_drops_non_finite_losses_and_refuses_tiny_or_constant_samples() -> None:
    loss_a, loss_b = _differential(30, seed=3, shift=0.2)
    loss_a[[4, 9]] = np.nan
    loss_b[11] = np.inf
    _, _, count = diebold_mariano(loss_a, loss_b, lag=1)
    assert count == 27
    assert math.isnan(diebold_mariano(np.ones(2), np.zeros(2), lag=0)[0])
    equal = diebold_mariano(np.full(20, 2.0), np.full(20, 1.0), lag=2)  # no variance: no test
    assert math.isnan(equal[0]) and math.isnan(equal[1]) and equal[2] == 20


def test_skill_is_one_minus_the_geometric_mean_of_clipped_defined_ratios() -> None:
    ratios = np.array([0.5, 2.0, 0.001, 1000.0, np.nan, 0.0, np.inf, 0.8])
    picks = np.random.default_rng(0).integers(0, ratios.size, size=(200, ratios.size))

    point, low, high, count = _with_interval(_gmean_point(ratios), picks)  # skill and its bootstrap interval

    defined = np.array([0.5, 2.0, 0.01, 100.0, 0.8])  # NaN, 0 and inf undefined; the extremes clipped
    assert count == defined.size
    assert point == pytest.approx(1.0 - stats.gmean(defined), rel=1e-12)
    assert low <= point <= high
