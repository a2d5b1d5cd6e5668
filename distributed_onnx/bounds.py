"""The bounds of every numeric setting, and of the inputs' values, each written once and read where it is checked.

Settings without an upper bound were taken at their word and failed far from where they were given: a
``--max-replicas 3000`` asked the ingress for 6002 consecutive free ports (exit 3, "rerun"), a huge
``--covariate-latency`` wrapped around in int64 arithmetic and fed windows vintages issued after their cutoff.
A checkpoint's metadata is bounded too (``model/checkpoint.py`` reads these when it reads the file): its
``context_length``, ``output_patch_size``, ``horizon_patches``, their product (one call's steps) and
``max_horizon_length`` by :data:`MAX_STEPS`, as the run's ``--context-length`` and ``--horizon`` are, and its
``native_quantiles`` by :data:`MAX_NATIVE_QUANTILES`. A ``context_length`` of 10^15 was taken by ``inspect`` and
sized the backtest's arrays, failing as "out of memory" (exit 3) with nothing naming the field.

Each bound is far above any real use and low enough that the arithmetic done with the value cannot overflow;
the typed settings (``Field(le=...)``) refuse a value beyond it in one line naming the setting (exit 2).

The inputs' bounds (:data:`MAX_SERIES_ID_BYTES`, :data:`FLOAT32_MAX`) are read by every door a series comes in by:
the backtest's and ``score``'s tables (``evaluation/data/validation.py``, ``evaluation/data/column_values.py``),
the served routes (``serve/wire/``) and the forecast log ``score`` reads (``live/``), so that a series one of
them takes, the others take too.
"""

from __future__ import annotations

import numpy as np

#: Steps of a horizon, a context, a stride or a season.
MAX_STEPS = 10_000_000
#: Counts: windows, groups, queued requests, failures in a row.
MAX_COUNT = 1_000_000_000
#: Minutes between a cutoff and the vintage it may read: 100 years, so cutoff - latency stays inside int64
#: microseconds (the as-of join's unit) for any timestamp the tables hold.
MAX_LATENCY_MINUTES = 100 * 525_960
#: Worker actors of a backtest, models a replica holds.
MAX_WORKERS = 100_000
#: CPUs and GPUs one actor or replica asks Ray for.
MAX_CPUS = 4096
MAX_GPUS = 64
#: The smallest nonzero share of a CPU or GPU an actor or replica may ask for: Ray counts resources in units of
#: 1/10,000 and refuses a request below one unit with its own error (``--cpus-per-actor 1e-300`` was exit 4).
MIN_RESOURCE_SHARE = 1e-4
#: Windows per model call (backtest and serve), requests merged into one call, warm-up rows.
MAX_ROWS_PER_BATCH = 10_000_000
#: Seconds of a timeout, a delay or a flush interval: one week.
MAX_SECONDS = 7 * 24 * 3600
#: Parts queued on each actor.
MAX_IN_FLIGHT = 10_000
#: Bytes of a request body or of what parsing requests may hold: 64 GiB.
MAX_BYTES = 64 << 30
#: Serve replicas: each one behind the ingress takes two ports on this machine's loopback (HTTP and gRPC), so
#: the ingress looks for 2 x replicas + 2 consecutive free ports; 512 replicas of one deployment is far beyond
#: one machine's cores, and a cluster that needs more runs several deployments.
MAX_REPLICAS = 512
#: Windows an export's parity compares (each runs the upstream pipeline in torch).
MAX_PARITY_WINDOWS = 100_000
#: A checkpoint's sampling interval: one year.
MAX_RESOLUTION_MINUTES = 366 * 24 * 60
#: Quantile levels a checkpoint predicts natively (its metadata's ``native_quantiles``): every forecast holds
#: windows x steps x levels values, so the count multiplies every array; real models predict 9 to a few dozen.
MAX_NATIVE_QUANTILES = 1_000
#: Windows ``tune`` forecasts: its largest batch is 256 windows, and every window is held in memory at once.
MAX_TUNE_WINDOWS = 65_536

#: The longest series id, in bytes of its UTF-8 encoding: what Arrow and Parquet store and what a fixed-width id
#: array is sized by, so the unit the cost is in (characters would let a 256-character id of 4-byte characters
#: weigh four times a 256-character ASCII one). An id is data of every forecast row and every logged row, and an
#: array of ids takes (rows x longest id) bytes: one unbounded id cost gigabytes. 1,024 bytes is far above any key
#: in use; it admits every id the backtest took (its bound) and every id the routes took (256 characters are at most
#: 1,024 bytes), so no id accepted before is refused.
MAX_SERIES_ID_BYTES = 1_024
#: The largest magnitude a value may have: the models read float32, where a larger one becomes infinite.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def id_bytes(series_id: str) -> int:
    """The length :data:`MAX_SERIES_ID_BYTES` bounds: ``series_id``'s UTF-8 bytes.

    >>> id_bytes("north"), id_bytes("Zürich"), id_bytes("東京")
    (5, 7, 6)
    """
    return len(series_id.encode("utf-8"))


def resource_share(value: float) -> float:
    """A GPU share an actor or replica asks for: none, or at least :data:`MIN_RESOURCE_SHARE` (a field validator)."""
    if 0 < value < MIN_RESOURCE_SHARE:
        raise ValueError(f"must be 0 or at least {MIN_RESOURCE_SHARE:g} (Ray counts resources in 1/10,000 units)")
    return value
