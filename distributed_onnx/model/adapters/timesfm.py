"""TimesFM 2.5 (``timesfm``'s ``TimesFM_2p5_200M_torch``): one NaN-marked context in, ``[rows, steps, 9]`` out.

The graphs ``distributed-onnx export timesfm`` builds hold all of upstream's ``forecast`` around the model
(docs/export.md): leading NaN masked, inner NaN interpolated, the input normalization, flip invariance, the
continuous quantile head, quantile crossing fixed and the autoregressive decode up to the exported horizon. So
the adapter only sends the window as it is, NaN for missing (a zero would be an observed 0, interpolated
through and counted in the normalization), and reads ``[rows, steps, quantiles]``; a horizon longer than the
graph's is refused (``long_horizon: refuse``: export again with ``--horizon``).
"""

from __future__ import annotations

from typing import ClassVar

from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter
from distributed_onnx.model.checkpoint import MissingValue


class TimesFMAdapter(ContextQuantilesAdapter):
    """Windows <-> ``{context}`` with NaN for missing; the output layout as the metadata says."""

    family: ClassVar[str] = "timesfm"
    default_missing_value: ClassVar[MissingValue] = "nan"
    allowed_missing_values: ClassVar[frozenset[str]] = frozenset({"nan"})
