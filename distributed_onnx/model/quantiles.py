"""Quantile levels: column names, validation, and mapping native model levels to requested ones.

A checkpoint predicts a fixed set of *native* quantile levels (``native_quantiles`` in its metadata), while a
run asks for the levels it wants to score and write. This module bridges the two in one place so the
backtest and the online deployment produce the same numbers for the same window:

- levels that the model predicts natively are copied (index selection, no arithmetic), so an online
  ``q0.5`` is bit-identical to the model's output;
- levels between two native ones are linearly interpolated;
- levels outside the native range are clamped to the nearest native level: extrapolating a quantile fan is
  unreliable, and a constant tail is what Chronos and GluonTS do too. Clamping changes what a level means (a
  requested 0.05/0.95 interval is really the model's 0.1/0.9 one, so its coverage is not a 90% interval's),
  so :func:`clamped_levels` says which requested levels are clamped and to what, for warnings and reports.

Pure numpy; no Ray, no ONNX Runtime.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from pydantic import AfterValidator

from distributed_onnx.errors import ConfigError

#: Two levels closer than this are the same level (``0.1`` and ``1 - 0.9`` differ by float noise).
LEVEL_TOLERANCE = 1e-9

__all__ = [
    "LEVEL_TOLERANCE",
    "ClampedLevel",
    "central_intervals",
    "clamped_levels",
    "describe_clamped",
    "interpolate_quantiles",
    "quantile_column_name",
    "strictly_ascending",
    "validate_quantiles",
]


def quantile_column_name(q: float) -> str:
    """Name of the forecast column for level ``q``: ``q0.1``, ``q0.25``, ``q0.5``, ``q0.1000001``.

    ``format(q, "g")`` keeps the shortest readable form, so names are stable across runs and match what a
    user writes in a configuration file. It rounds to six digits, though: 0.1000001 and 0.1000002 would share
    one column (one silently lost) and 0.9999999 would read ``q1``. So a level that six digits do not give back
    exactly is named by its shortest exact form (``repr``), which differs for every distinct float: two levels
    can never share a column, and ordinary levels keep their names.
    """
    level = float(q)
    short = format(level, "g")
    return "q" + (short if float(short) == level else repr(level))


def strictly_ascending(levels: Sequence[float]) -> bool:
    """Whether each level lies above the one before by more than :data:`LEVEL_TOLERANCE` (closer ones are one level
    twice): the rule for requested levels (:func:`validate_quantiles`) and a checkpoint's native ones alike.

    >>> strictly_ascending([0.1, 0.5, 0.9]), strictly_ascending([0.1, 0.1 + 1e-12, 0.9])
    (True, False)
    """
    return all(b - a > LEVEL_TOLERANCE for a, b in itertools.pairwise(levels))


def validate_quantiles(levels: Sequence[float], name: str = "quantiles") -> tuple[float, ...]:
    """Return ``levels`` as a tuple of floats after checking they are usable quantile levels.

    Levels must be non-empty, strictly inside (0, 1) and strictly increasing: every consumer (interpolation,
    metrics, column order) relies on the ascending order, so it is checked once here rather than assumed.
    """
    values = tuple(float(q) for q in levels)
    if not values:
        raise ConfigError(f"{name} must list at least one quantile level, got an empty list.", key=name)
    bad = [q for q in values if not (0.0 < q < 1.0)]
    if bad:
        raise ConfigError(f"{name} must lie strictly between 0 and 1; got {bad} in {list(values)}.", key=name)
    if not strictly_ascending(values):
        raise ConfigError(
            f"{name} must be strictly increasing without duplicates; got {list(values)}. Sort them and remove repeats.",
            key=name,
        )
    return values


def _interpolation_plan(
    native: tuple[float, ...], requested: tuple[float, ...]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """For each requested level: lower native index, upper native index and the weight of the upper one.

    A weight of exactly 0 means "copy the lower level": native hits and clamped levels both get it.
    """
    nat = np.asarray(native, dtype=np.float64)
    req = np.asarray(requested, dtype=np.float64)
    last = len(native) - 1
    # Index of the first native level >= r - tol: a native hit lands exactly on its own index.
    upper = np.searchsorted(nat, req - LEVEL_TOLERANCE, side="left")
    lower = np.empty_like(upper)
    weight = np.zeros(len(requested), dtype=np.float64)
    for j, (r, up) in enumerate(zip(req, upper, strict=True)):
        if up > last:  # above the native range: clamp to the top level
            lower[j] = upper[j] = last
        elif abs(nat[up] - r) <= LEVEL_TOLERANCE or up == 0:  # native hit, or clamp to the bottom
            lower[j] = up
        else:
            lower[j] = up - 1
            weight[j] = (r - nat[up - 1]) / (nat[up] - nat[up - 1])
    return lower.astype(np.intp), upper.astype(np.intp), weight


def interpolate_quantiles(
    predictions: npt.NDArray[Any], native: Sequence[float], requested: Sequence[float]
) -> npt.NDArray[np.floating[Any]]:
    """Map ``predictions[..., n_native]`` to ``[..., n_requested]`` levels.

    Vectorised over every leading axis (windows, leads). Floating inputs keep their dtype (float32 in,
    float32 out), so the forecast tables do not double in size; the interpolation itself is computed in
    float64 and rounded once. When every requested level is native the result is a pure index selection:
    exact copies of the model's values, whatever they are (NaN and inf included).
    """
    nat = validate_quantiles(native, "native quantiles")
    req = validate_quantiles(requested, "requested quantiles")
    values = np.asarray(predictions)
    if values.ndim == 0 or values.shape[-1] != len(nat):
        raise ConfigError(
            f"predictions must have a last axis of {len(nat)} native quantiles {list(nat)}; got shape {values.shape}.",
            key="native_quantiles",
        )
    out_dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.dtype(np.float64)
    lower, upper, weight = _interpolation_plan(nat, req)
    # Fancy indexing copies: the result never aliases the caller's buffer.
    result: npt.NDArray[np.floating[Any]] = values[..., lower].astype(out_dtype, copy=False)
    between = np.flatnonzero(weight > 0.0)
    if between.size:
        low = values[..., lower[between]].astype(np.float64)
        high = values[..., upper[between]].astype(np.float64)
        result[..., between] = (low + weight[between] * (high - low)).astype(out_dtype)
    return result


@dataclass(frozen=True)
class ClampedLevel:
    """A requested level outside the model's native range, and the native level whose values it gets."""

    requested: float
    served_by: float

    def as_record(self) -> dict[str, float]:
        """``{"requested": 0.05, "served_by": 0.1}``: the form a summary file records."""
        return {"requested": self.requested, "served_by": self.served_by}


def clamped_levels(requested: Sequence[float], native: Sequence[float]) -> list[ClampedLevel]:
    """The requested levels that :func:`interpolate_quantiles` clamps, each with the native level it copies.

    A level is clamped when it lies below the lowest or above the highest native level by more than
    :data:`LEVEL_TOLERANCE` (within it, it *is* that native level). Ascending, like ``requested``; empty when
    every requested level lies inside the native range.
    """
    nat = validate_quantiles(native, "native quantiles")
    req = validate_quantiles(requested, "requested quantiles")
    lowest, highest = nat[0], nat[-1]
    clamped = []
    for level in req:
        if level < lowest - LEVEL_TOLERANCE:
            clamped.append(ClampedLevel(level, lowest))
        elif level > highest + LEVEL_TOLERANCE:
            clamped.append(ClampedLevel(level, highest))
    return clamped


def describe_clamped(clamped: Sequence[ClampedLevel], native: Sequence[float] = ()) -> str:
    """One line for a warning: which levels are clamped to what, and what that does to their intervals (the
    backtest's plan note and ``score``'s warning; ``native`` empty: a record that names no native range)."""
    pairs = ", ".join(f"{c.requested:g} -> {c.served_by:g}" for c in clamped)
    span = f" {native[0]:g}..{native[-1]:g}" if native else ""
    return (
        f"requested quantile level(s) outside the model's native range{span} are clamped "
        f"to the nearest native level ({pairs}): their forecasts are the native level's, so an interval built on "
        "them is narrower than its name says (its coverage is that of the native interval)"
    )


def central_intervals(quantiles: Sequence[float]) -> list[tuple[float, float]]:
    """The symmetric central intervals ``(q, 1 - q)`` with ``q < 0.5`` whose both ends were requested.

    Coverage is only defined for intervals whose two ends are forecast, so this is the single place that
    decides which ones are scored. Pairs come widest first (ascending ``q``) and carry the levels exactly
    as listed in ``quantiles``, so they can be looked up in the list without tolerance.
    """
    levels = sorted(float(q) for q in quantiles)
    pairs: list[tuple[float, float]] = []
    for q in levels:
        if q >= 0.5 - LEVEL_TOLERANCE:
            break
        upper = next((p for p in levels if abs(p - (1.0 - q)) <= LEVEL_TOLERANCE), None)
        if upper is not None and (not pairs or abs(pairs[-1][0] - q) > LEVEL_TOLERANCE):
            pairs.append((q, upper))
    return pairs


def _checked_levels(value: list[float] | None) -> list[float] | None:
    if value is None:
        return None
    try:
        return list(validate_quantiles(value))
    except ConfigError as exc:
        # A ValueError, so pydantic reports it like any invalid value: with the field (and file) it came from.
        raise ValueError(exc.message) from exc


#: Optional requested quantile levels in settings and requests: strictly inside (0, 1), ascending.
QuantileLevels = Annotated[list[float] | None, AfterValidator(_checked_levels)]
