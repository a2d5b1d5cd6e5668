"""Stage 2 of a backtest, plan: the checkpoints and the :class:`~..dataset.Dataset` -> one frozen :class:`RunPlan`.

:func:`resolve` reads the settings' checkpoints and checks them against each other and the settings before any
data is read (they fix the grid and the windows the data is loaded for: :class:`Checkpoints`); :func:`plan`
fingerprints the run and cuts its windows into parts. The run's stage (:mod:`..driver.run`) takes the plan.
:func:`prepare` is the first two stages in one call, for tools and tests that want a plan from settings.

The modules behind this one are private to the stage (``_checkpoints``, ``_plan``, ``_part_count``): the
``stages-private`` import contract refuses an import of them from outside the stage.
"""

from __future__ import annotations

from distributed_onnx.evaluation import dataset
from distributed_onnx.evaluation.planning._checkpoints import Checkpoints, resolve
from distributed_onnx.evaluation.planning._part_count import dispatch_order
from distributed_onnx.evaluation.planning._plan import PART_FORMAT, RunPlan, plan
from distributed_onnx.evaluation.settings import BacktestSettings

__all__ = ["PART_FORMAT", "Checkpoints", "RunPlan", "dispatch_order", "plan", "prepare", "resolve"]


def prepare(settings: BacktestSettings) -> RunPlan:
    """Resolve the checkpoints, load the data for them and plan the run: what a backtest does before its run."""
    models = resolve(settings)
    return plan(settings, models, dataset.load(settings, models.spec, models.resolution_minutes))
