"""Which resampling gives a run's 95% intervals, and the circular block bootstrap over window origins.

The leaderboard (``leaderboard.parquet``, :mod:`.leaderboard`) and the reports (:mod:`.uncertainty`) read
their intervals from here, so both say the same thing about the same run:

- ``series``: at :data:`MIN_SERIES` series or more, a percentile bootstrap over series (fev's: the leaderboard
  draws it, ``default_rng(SEED).integers``).
- ``origin_blocks``: below it, a **circular block bootstrap over window origins** (Politis & Romano 1992, the
  circular variant of Künsch's 1989 moving-block bootstrap). With one series every series resample is that series:
  the interval has no width (the bundled data gave ``[0.832, 0.832]``) and says "certain" where nothing is known;
  with a few series a bootstrap over them is barely better. So the run's window origins, in time order, are cut
  into blocks of ``L`` consecutive origins; ``ceil(T / L)`` blocks are drawn with replacement and their origins'
  sums added up (the last block cut so a resample holds ``T`` origins), every series of an origin moving with it,
  so the dependence between series at one time is kept. ``L = ceil(H / spacing)``: the windows of origins closer
  than the horizon share target steps (the lag of the Diebold-Mariano test, plus one), so a block holds the
  origins whose errors overlap. A block may start at any origin and wraps past the last one to the first (the
  origins on a circle): why circular, not Künsch's blocks that start only at ``0 .. T - L``. Those give an origin
  within ``L`` of either end fewer blocks that cover it (the first origin one start of ``T - L + 1``, a middle one
  ``L``): the edge effect. With ``L`` near ``T / 3`` (horizon 96, 300 origins) the edges were almost never drawn,
  and where they hold the worst windows every resample missed them: the point estimate lay above its own
  interval. On the circle every drawn origin is any origin with equal chance, so each is drawn once per resample
  in expectation, as in the run itself: the resampled sums are centred on the run's own wherever the extreme
  windows fall. The remedy's own price: a block that starts near the last origin goes on with the first ones,
  which were not next to them in time.
- ``none``: below :data:`MIN_SERIES` series and fewer than two blocks of origins: no interval can be formed
  (NaN), and both say so.

Each model's sums per origin (:class:`~.conventions.WindowSums`, pooled over the series at that origin) give every
pooled metric of a resample exactly (:mod:`.registry`'s definitions), as the per-series sums do for the series
bootstrap. The resamples are drawn :data:`CHUNK` at a time (the ``[B, T]`` weights of a run of 100,000 origins
would be 0.8 GB); the generator's stream does not depend on how it is cut, so the draws are the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.conventions import WindowSums, named_columns
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.registry import POOLED, PooledSums, leaderboard_order, of_convention

__all__ = [
    "MIN_SERIES",
    "N_RESAMPLES",
    "SEED",
    "OriginBlocks",
    "OriginSums",
    "Resampling",
    "block_weights",
    "origin_blocks",
    "overlap_lag",
    "percentile_interval",
]

SEED = 123  # fev's default seed
N_RESAMPLES = 1000
#: Below this many series the intervals resample blocks of window origins (module docstring).
MIN_SERIES = 30
#: Resamples whose block weights are drawn and applied at once (``8 x CHUNK x T`` bytes).
CHUNK = 32
F64 = npt.NDArray[np.float64]
Resampling = Literal["series", "origin_blocks", "none"]


@dataclass(frozen=True)
class OriginSums:
    """Every model's sums per window origin, ``[T, columns]`` in one origin order (what the resamples weigh), in
    :class:`~.conventions.WindowSums`' layout."""

    origins_us: npt.NDArray[np.int64]
    sums: dict[str, F64]

    @classmethod
    def of(cls, windows: Mapping[str, WindowSums]) -> OriginSums:
        first = next(iter(windows.values()))
        origins = first.origins
        sums = {}
        for model, window in windows.items():
            if not np.array_equal(window.origins, origins):  # every model is scored on the same pairs: same origins
                raise ValueError(f"{model}'s window origins differ from the first model's")
            sums[model] = np.asarray(window.sums, dtype=np.float64)
        return cls(origins, sums)

    def metrics(self, model: str, weights: F64, has_median: bool) -> dict[str, F64]:
        """Each pooled global metric of ``model`` for each row of ``weights[B, T]`` (how often each origin is drawn),
        as :mod:`.registry` defines it (per origin, ``scaled`` counts pairs: the scaled metrics' mean is over them)."""
        view = PooledSums(named_columns(weights @ self.sums[model]))
        with np.errstate(divide="ignore", invalid="ignore"):
            return {
                metric.name: metric.value(view)
                for metric in leaderboard_order(of_convention(POOLED, has_median))
                if metric.per == "unit"
            }


def block_chunks(n_origins: int, block: int, n_resamples: int, seed: int = SEED, chunk: int = CHUNK) -> Iterator[F64]:
    """``[rows, T]`` at a time: how often each origin is drawn by each circular block resample (``ceil(T / L)``
    blocks starting anywhere in ``0 .. T - 1`` and wrapping past the last origin to the first, the last block cut so
    every resample holds ``T`` origins: the module docstring says why circular)."""
    rng = np.random.default_rng(seed)
    n_blocks = math.ceil(n_origins / block)
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        starts = rng.integers(0, n_origins, size=(rows, n_blocks))
        picks = ((starts[:, :, None] + np.arange(block)) % n_origins).reshape(rows, -1)[:, :n_origins]
        yield np.stack([np.bincount(row, minlength=n_origins) for row in picks]).astype(np.float64)


def block_weights(n_origins: int, block: int, n_resamples: int, seed: int = SEED) -> F64:
    """``[B, T]``: every resample's weights at once (:func:`block_chunks`, for small runs and tests)."""
    return np.concatenate(list(block_chunks(n_origins, block, n_resamples, seed)))


@dataclass(frozen=True)
class OriginBlocks:
    """Which resampling a run's intervals use and, under ``origin_blocks``, every model's resampled metrics."""

    resampling: Resampling
    n_series: int
    n_origins: int
    block: int
    n_resamples: int
    has_median: bool
    origins: OriginSums
    #: model -> metric -> ``[B]`` resampled pooled metric (``origin_blocks`` only; empty otherwise).
    resampled: dict[str, dict[str, F64]] = field(default_factory=dict)

    def interval(self, model: str, metric: str) -> tuple[float, float]:
        """The metric's 95% interval from the origin blocks (NaN under ``none``, or a metric not resampled)."""
        values = self.resampled.get(model, {}).get(metric)
        return (math.nan, math.nan) if values is None else percentile_interval(values)


def origin_blocks(
    scores: PairScores, step_us: int, min_series: int = MIN_SERIES, n_resamples: int = N_RESAMPLES
) -> OriginBlocks:
    """The resampling of ``scores``' intervals (module docstring) and, for origin blocks, the resamples."""
    models = list(scores.models)
    n_series = len(scores.pooled[models[0]].series_ids)
    has_median = scores.has_median
    origins = OriginSums.of({model: scores.windows[model] for model in models})
    n_origins = int(origins.origins_us.size)
    block = overlap_lag(origins.origins_us, scores.horizon, step_us) + 1
    resampling: Resampling = "series"
    if n_series < min_series:
        resampling = "origin_blocks" if n_origins >= 2 * block else "none"
    resampled: dict[str, dict[str, list[F64]]] = {}
    if resampling == "origin_blocks":
        for weights in block_chunks(n_origins, block, n_resamples):
            for model in models:
                for metric, values in origins.metrics(model, weights, has_median).items():
                    resampled.setdefault(model, {}).setdefault(metric, []).append(values)
    return OriginBlocks(
        resampling,
        n_series,
        n_origins,
        block,
        n_resamples,
        has_median,
        origins,
        {model: {metric: np.concatenate(parts) for metric, parts in by.items()} for model, by in resampled.items()},
    )


def percentile_interval(resampled: F64) -> tuple[float, float]:
    """The 95% percentile interval of the resamples that are defined; NaN when none is.

    A resample is undefined (NaN) when every series it drew has no scored pair (or no scale) for the metric;
    when all are (no series, or none with a scored pair: seen in live scoring, whose groups can hold such
    series), there is no interval, and asking ``nanquantile`` for one would warn "All-NaN slice".
    """
    defined = resampled[~np.isnan(resampled)]
    if not defined.size:
        return math.nan, math.nan
    low, high = np.quantile(defined, [0.025, 0.975])
    return float(low), float(high)


def overlap_lag(origins_us: npt.NDArray[np.int64], horizon: int, step_us: int) -> int:
    """``ceil(H / spacing) - 1``: the lags at which windows of nearby origins share target steps."""
    if origins_us.size < 2 or step_us <= 0:
        return 0
    spacing = max(1.0, float(np.median(np.diff(np.sort(origins_us)))) / step_us)
    return max(0, math.ceil(horizon / spacing) - 1)
