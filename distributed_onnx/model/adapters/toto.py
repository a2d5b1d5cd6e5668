"""Toto (Datadog's ``toto-ts``): one NaN-marked context in, a Student-t mixture per step out; quantiles here.

Toto's output is a distribution, not quantiles: per forecast step a mixture of Student-t components (weights,
degrees of freedom, location, scale), after the model's causal scaler is undone. Upstream's forecaster samples
from it (``TotoForecaster.generate_samples``) and its quantiles are sample quantiles: random, so no graph can
reproduce them. What is deterministic, and what those samples estimate, is the mixture itself: the graph
``distributed-onnx export toto`` builds emits its parameters (``output_distribution: student_t_mixture``,
``[rows, steps, components, 4]``) and this adapter computes the mixture's exact quantiles at the native levels
(its CDF, Student-t CDFs weighted, inverted by safeguarded Newton steps in float64).

Missing values go in as NaN: the graph turns them into upstream's ``padding_mask`` (False = not a value) with
0.0 in the series, as ``MaskedTimeseries`` documents; the patches before a window's first value attend to nothing
and are attended by nothing, so a window with less history than the context forecasts what upstream's forecaster
does given that history (``distributed_onnx/export/toto.py``). One call forecasts one patch; a longer horizon is
refused (upstream reaches it by feeding sampled values back: ``long_horizon: refuse``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import special

from distributed_onnx.errors import CheckpointGraphMismatchError, ConfigError
from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter
from distributed_onnx.model.checkpoint import CheckpointMetadata

#: Newton steps at most; each falls back to bisection outside the bracket, so this many always converge.
MAX_STEPS = 200
#: Converged when a step moves the quantile by less than this, relative to its size (float64 roots).
RELATIVE_TOLERANCE = 1e-12


class TotoAdapter(ContextQuantilesAdapter):
    """Windows <-> ``{context}`` with NaN for missing; the mixture's parameters -> its native quantiles."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        super().__init__(metadata)
        if metadata.output_distribution != "student_t_mixture":
            raise ConfigError(
                f"model_family 'toto' emits a Student-t mixture per step; the metadata says output_distribution "
                f"{metadata.output_distribution!r}: set it to 'student_t_mixture' (export the checkpoint again).",
                key="output_distribution",
            )

    def decode(self, outputs: Mapping[str, np.ndarray], target_rows: np.ndarray) -> np.ndarray:
        metadata = self._metadata
        params = np.asarray(outputs[metadata.output_name])
        rows, steps = int(target_rows.shape[0]), metadata.horizon_length
        if params.ndim != 4 or params.shape[0] != rows or params.shape[1] != steps or params.shape[3] != 4:
            raise CheckpointGraphMismatchError(
                f"Output {metadata.output_name!r} has shape {params.shape}, but output_distribution "
                f"'student_t_mixture' with horizon_length {steps} means ({rows}, {steps}, components, 4): "
                "export the checkpoint again.",
            )
        return mixture_quantiles(params[target_rows], metadata.native_quantiles)


def mixture_quantiles(params: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """``[rows, steps, components, 4]`` (weight, df, loc, scale) -> ``[rows, len(levels), steps]`` float32.

    The q-quantile of ``sum_k w_k T(df_k, loc_k, scale_k)`` is the root of its CDF minus q, which lies between
    the components' own q-quantiles (``stdtrit``): the bracket. It starts at their weighted mean (inside the
    bracket), takes Newton steps (the mixture's density) inside it and bisects where a step would leave it; the
    bracket shrinks at every step, so every root converges. Each step computes only the roots not yet
    converged: a few slow ones no longer make every root pay for their steps (the CDF's ``stdtr`` is most of
    the cost, as much as the graph's own pass at Toto's published shapes).
    """
    values = np.asarray(params, dtype=np.float64)
    rows, steps, components = values.shape[0], values.shape[1], values.shape[2]
    q = np.asarray(levels, dtype=np.float64)
    weight, df, loc, scale = (values[..., index] for index in range(4))  # [R, S, K]
    weight = weight / weight.sum(axis=-1, keepdims=True)  # the softmax, renormalised in float64
    log_norm = special.gammaln((df + 1) / 2) - special.gammaln(df / 2) - 0.5 * np.log(df * np.pi) - np.log(scale)
    # One root per (row, step, level), each with its mixture's K components: [R * S * Q, K].
    shape = (rows, steps, q.size, components)
    weight, df, loc, scale, log_norm = (
        np.broadcast_to(each[:, :, None, :], shape).reshape(-1, components)
        for each in (weight, df, loc, scale, log_norm)
    )
    level = np.broadcast_to(q, shape[:3]).reshape(-1)
    own = loc + scale * special.stdtrit(df, level[:, None])  # each component's q-quantile
    low, high = own.min(axis=-1), own.max(axis=-1)
    x = (weight * own).sum(axis=-1)
    active = np.arange(x.size)
    for _ in range(MAX_STEPS):
        w, d, m, s, norm = weight[active], df[active], loc[active], scale[active], log_norm[active]
        here, lo, hi = x[active], low[active], high[active]
        t = (here[:, None] - m) / s
        below = (w * special.stdtr(d, t)).sum(axis=-1) - level[active]  # CDF(x) - q
        density = (w * np.exp(norm - (d + 1) / 2 * np.log1p(t * t / d))).sum(axis=-1)
        lo = np.where(below < 0, here, lo)
        hi = np.where(below < 0, hi, here)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = here - below / density
        # A root reached to float64's resolution (a Newton step that rounds to no move, or CDF(x) = q exactly) is
        # done where it is: bisecting from it instead threw the converged value back into a bracket whose other
        # side had never narrowed, and tens of bisection steps crawled back to it.
        inside = (np.isfinite(newton) & (newton > lo) & (newton < hi)) | (newton == here) | (below == 0)
        stepped = np.where(inside, newton, (lo + hi) / 2)
        done = np.abs(stepped - here) <= RELATIVE_TOLERANCE * np.maximum(np.abs(here), 1.0)
        x[active], low[active], high[active] = stepped, lo, hi
        active = active[~done]
        if active.size == 0:
            break
    return np.ascontiguousarray(x.reshape(rows, steps, q.size).transpose(0, 2, 1), dtype=np.float32)
