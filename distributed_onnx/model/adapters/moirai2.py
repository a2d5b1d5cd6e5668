"""Moirai 2 (Salesforce's ``uni2ts``, ``Moirai2Forecast``): one NaN-marked context in, ``[rows, quantiles, steps]`` out.

The graphs ``distributed-onnx export moirai2`` builds take ``context`` f32 ``[B, T]`` with NaN for missing and
answer ``[B, 9 quantiles, horizon]``. The graph derives the observed mask from NaN (``Moirai2Forecast.predict``
marks a NaN unobserved before imputing it), so missing values must stay NaN: a zero would be observed. Longer
horizons than one model call are computed inside the graph by upstream's own rule, up to the horizon it was
exported for (``long_horizon: refuse`` beyond it: export again with ``--horizon``).
"""

from __future__ import annotations

from typing import ClassVar

from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter
from distributed_onnx.model.checkpoint import MissingValue


class Moirai2Adapter(ContextQuantilesAdapter):
    """Windows <-> ``{context}`` with NaN for missing; covariates refused (the graph takes one target)."""

    family: ClassVar[str] = "moirai2"
    default_missing_value: ClassVar[MissingValue] = "nan"
    allowed_missing_values: ClassVar[frozenset[str]] = frozenset({"nan"})
