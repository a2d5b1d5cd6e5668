"""fev, imported on first use: it is an optional extra, and the backtest itself never needs it."""

from __future__ import annotations

import os
import sys
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


def raised_by_fev(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while fev's own code ran (a frame of the fev package on its traceback): fev
    refusing a task's windows or data (a cutoff past the data, more windows than it holds, a target its metrics
    cannot subtract), not a bug of ours, whose traceback holds no fev frame."""
    fev = sys.modules.get("fev")
    if fev is None or fev.__file__ is None:
        return False
    folder = os.path.dirname(fev.__file__) + os.sep
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename.startswith(folder):
            return True
        frame = frame.tb_next
    return False
