"""TiRex (NX-AI's ``tirex-ts``, ``TiRexZero``): one NaN-marked context in, ``[rows, steps, quantiles]`` out.

TiRex's official ONNX graph (``examples/tirex_onnx.ipynb`` of NX-AI/tirex) takes ``context`` f32 ``[B, T]``
with NaN for missing and answers ``[B, 32 steps, 9 quantiles]``; longer horizons append the 32 steps as NaN
and call again (``long_horizon: append_missing``). The graphs ``distributed-onnx export tirex`` builds from
the package's own classes keep that contract. The model's tokenizer scales by the non-NaN mean and spread and
feeds the model a NaN mask beside the values, so missing values must stay NaN: a zero would be observed.
"""

from __future__ import annotations

from typing import ClassVar

from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter


class TiRexAdapter(ContextQuantilesAdapter):
    """Windows <-> ``{context}`` with NaN for missing; the output layout and unrolling as the metadata says."""

    family: ClassVar[str] = "tirex"
