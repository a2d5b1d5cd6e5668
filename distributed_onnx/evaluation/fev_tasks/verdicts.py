"""Whether a task x checkpoint that did not finish is ``rejected`` (no rerun gets past it) or ``failed`` (a rerun
may): decided here, once, from the class of the error that stopped it.

The split was made where each error was caught, each site with its own rule, and one site got it wrong: every
error of loading a task's data was ``failed`` ("rerun to retry"), so a task whose definition could never work
(an ``initial_cutoff`` without the zone its data's timestamps carry, fev's ``ArrowInvalid``; a ``dataset_path``
fev cannot load) told the user to rerun, and every rerun failed the same way. docs/fev.md: only failed pairs are
worth a rerun.

- ``rejected``: the task's definition or data, as refused by this package (exit 2: :class:`ConfigError`,
  :class:`DataError`, the backtest refusing the task's run) or by fev and pyarrow (``ValueError``, which
  ``pyarrow.ArrowInvalid`` is, ``KeyError``, ``TypeError``, ``AssertionError``: fev's own checks);
- ``failed``: what the environment decides (:class:`OSError`: a missing file, a store or a network that did not
  answer; exit 3 errors), forecasts missing because parts failed, and anything else (fev wraps every error of
  its download in a ``RuntimeError``, so a hub dataset without network lands here).
"""

from __future__ import annotations

from typing import Literal

from distributed_onnx.errors import ConfigError, DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.predictions import MissingForecastsError

__all__ = ["FAILED", "REJECTED", "Verdict", "verdict"]

Verdict = Literal["rejected", "failed"]
REJECTED: Verdict = "rejected"
FAILED: Verdict = "failed"

#: The classes of a task's own definition or data refused by fev or pyarrow (``ArrowInvalid`` is a ValueError).
_DEFINITION_ERRORS = (ValueError, KeyError, TypeError, AssertionError)


def verdict(exc: BaseException) -> Verdict:
    """``rejected`` where no rerun gets past ``exc``, else ``failed`` (module docstring)."""
    if isinstance(exc, MissingForecastsError):  # a ValueError, but of parts that failed: a rerun runs them again
        return FAILED
    if isinstance(exc, DistributedOnnxError):
        return REJECTED if exc.exit_code == ConfigError.exit_code else FAILED
    if isinstance(exc, OSError):
        return FAILED
    return REJECTED if isinstance(exc, _DEFINITION_ERRORS) else FAILED
