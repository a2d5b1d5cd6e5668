"""Export-only replacements of upstream code that does not export, applied for the duration of an export.

Upstream code that does not export (``torch.nanmean`` has no ONNX symbolic; TiRex runs its recurrence in
bfloat16, which ONNX Runtime's CPU MatMul lacks) is replaced only inside :func:`patched`, for the duration
of the export, by code computing the same values from ops that export; the upstream package itself is never
changed. Each replacement is checked by the parity report (:mod:`.parity_check`): upstream's own pipeline,
unpatched, against ONNX Runtime through this package's :class:`~distributed_onnx.model.worker.InferenceWorker`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from distributed_onnx.export.torch_extra import require_torch


@contextlib.contextmanager
def patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    """``owner.name = replacement`` for the duration of the block (an export), restored afterwards."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def observed_mean(x: Any) -> Any:
    """``torch.nanmean(x, dim=-1, keepdim=True)`` without ``nanmean`` (no ONNX symbolic): the sum of the non-NaN
    values over their count; NaN for a row without any, as ``nanmean`` gives."""
    torch = require_torch()
    observed = ~torch.isnan(x)
    count = observed.sum(dim=-1, keepdim=True).to(x.dtype)
    return torch.where(observed, x, torch.zeros_like(x)).sum(dim=-1, keepdim=True) / count
