"""Chronos-Bolt (``chronos-forecasting``'s ``ChronosBoltModelForForecasting``): one NaN-marked context in.

The model derives its mask from NaN (``encode``: ``mask = ~isnan(context)``) and normalizes each row by its
non-NaN mean and spread (``InstanceNorm``), so a missing value must reach it as NaN: a zero would be counted
as an observed 0 in both. Its output is ``[rows, 9 quantiles, prediction_length]`` per call; longer horizons
follow ``ChronosBoltPipeline.predict``'s quantile paths (``long_horizon: quantile_paths``). The metadata that
``distributed-onnx export chronos_bolt`` writes says all of this; the adapter only refuses metadata that
would feed the graph zeros.
"""

from __future__ import annotations

from typing import ClassVar

from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter


class ChronosBoltAdapter(ContextQuantilesAdapter):
    """Windows <-> ``{context}`` with NaN for missing; the output layout and unrolling as the metadata says."""

    family: ClassVar[str] = "chronos_bolt"
