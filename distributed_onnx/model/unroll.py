"""Horizons longer than one call: the strategies a checkpoint's ``long_horizon`` names, in numpy.

A graph emits ``steps`` (its metadata's ``horizon_length``) per call. A longer horizon is reached the way the
family's own pipeline reaches it, so that a backtest equals that pipeline's forecasts:

- ``append_missing`` (TiRex's ``_forecast_tensor`` and its ONNX example): append the steps just forecast to the
  context as missing values (NaN), keep the last ``context_length`` steps and call again; the model sees how
  far ahead it is from the trailing gap.
- ``quantile_paths`` (``ChronosBoltPipeline.predict``): after the first call, each native quantile's forecast
  is appended to the context as its own path (``windows x quantiles`` rows per call); the ``quantiles x
  quantiles`` forecasts of a window are reduced to the native levels by empirical quantiles (linear
  interpolation, as ``torch.quantile``), and each path gets its level's reduced forecast appended next.

Pure logic over a ``call`` function (context -> native block), so it is tested without ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from distributed_onnx.errors import ConfigError
from distributed_onnx.model.checkpoint import LongHorizon

#: ``context [rows, context_length]`` (NaN = missing) -> ``[rows, n_native_quantiles, steps]``.
ModelCall = Callable[[np.ndarray], np.ndarray]


def unroll(
    call: ModelCall,
    context: np.ndarray,
    horizon: int,
    *,
    strategy: LongHorizon,
    native_quantiles: Sequence[float],
) -> np.ndarray:
    """``[W, n_native, horizon]`` from as many calls as ``horizon`` needs, by ``strategy``.

    ``context`` is ``[W, context_length]`` on the model's grid; every call gets that width (the oldest steps
    drop out as forecasts are appended).
    """
    first = call(context)
    blocks = [first]
    done = first.shape[2]
    if done >= horizon:
        return first[:, :, :horizon]
    if strategy == "append_missing":
        while done < horizon:
            gap = np.full((context.shape[0], blocks[-1].shape[2]), np.nan, dtype=np.float32)
            context = _keep_last(np.concatenate([context, gap], axis=1), context.shape[1])
            blocks.append(call(context))
            done += blocks[-1].shape[2]
    elif strategy == "quantile_paths":
        blocks.extend(_quantile_paths(call, context, first, horizon - done, native_quantiles))
    else:
        raise ConfigError(
            f"horizon {horizon} needs more than one call of {first.shape[2]} steps, but the checkpoint's "
            f"long_horizon is {strategy!r}: ask at most {first.shape[2]} steps or declare how the graph unrolls.",
            key="horizon",
        )
    return np.concatenate(blocks, axis=2)[:, :, :horizon]


def _quantile_paths(
    call: ModelCall, context: np.ndarray, first: np.ndarray, remaining: int, native_quantiles: Sequence[float]
) -> list[np.ndarray]:
    n_windows, width = context.shape
    n_levels = first.shape[1]
    levels = np.asarray(native_quantiles, dtype=np.float64)
    paths = np.repeat(context[:, None, :], n_levels, axis=1)  # [W, Q, C]: one context per quantile path
    prediction = first
    blocks = []
    while remaining > 0:
        paths = _keep_last(np.concatenate([paths, prediction], axis=2), width)
        samples = call(paths.reshape(n_windows * n_levels, width))  # [W * Q, Q, steps]
        samples = samples.reshape(n_windows, n_levels * n_levels, -1)
        # torch.quantile's default (linear) in float32 as upstream, computed in float64 and cast back.
        reduced = np.quantile(samples.astype(np.float64), levels, axis=1, method="linear")  # [Q, W, steps]
        prediction = np.ascontiguousarray(reduced.transpose(1, 0, 2), dtype=np.float32)
        blocks.append(prediction)
        remaining -= prediction.shape[2]
    return blocks


def _keep_last(values: np.ndarray, width: int) -> np.ndarray:
    return np.ascontiguousarray(values[..., values.shape[-1] - width :], dtype=np.float32)
