"""``torch`` for the export, or the install hint of the extra that brings it.

torch comes with the ``export`` extra only: the backtest and serving never import it. Every export module that
needs it asks here, so a missing torch is one message (exit 2, the ``pip install`` line), not an ImportError.
"""

from __future__ import annotations

from typing import Any

from distributed_onnx.errors import MissingExtraError


def require_torch() -> Any:
    """``torch``, or the install hint of the extra that brings it."""
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError.for_package("torch", "export", exc) from exc
    return torch
