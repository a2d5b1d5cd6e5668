"""fev, imported on first use: it is an optional extra, and the backtest itself never needs it."""

from __future__ import annotations

from typing import Any

from distributed_onnx.errors import MissingExtraError

#: The fev release whose summaries and metric code these modules follow (pinned by the ``fev`` extra).
FEV_VERSION = "0.10.0"


def load_fev() -> Any:
    """The ``fev`` module, or :class:`MissingExtraError` naming the extra that installs it."""
    try:
        import fev
    except ImportError as exc:
        raise MissingExtraError.for_package("fev", "fev") from exc
    return fev
