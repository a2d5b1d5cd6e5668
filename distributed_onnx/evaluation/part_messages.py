"""What the driver sends an actor for a backtest and what the actor sends back per part: the two sides' contract.

The driver (:mod:`.driver`) builds one :class:`PartJob` per run and reads a :class:`PartReceipt` per finished
part; the actor (:mod:`.actor`) runs the job's parts and writes the receipts. Both sides import this module and
neither imports the other's internals for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import BaseModel, Field

from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.vintages import VintagedCovariates
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles
from distributed_onnx.evaluation.data.windows import WindowPlan, WindowSpec
from distributed_onnx.evaluation.grouping import GroupedWindows
from distributed_onnx.location import Location

#: The stage of one model's calls in a run of several (``model:NAME`` in a receipt's seconds and in summary.json's
#: ``timing.actor_stage_s``), beside the models' total ``model``: the variant comparison's speed ratio.
MODEL_STAGE_PREFIX = "model:"


@dataclass(frozen=True)
class PartJob:
    """Everything an actor needs to run any part of one backtest; sent to each actor once."""

    source: SeriesSource
    plan: WindowPlan
    spec: WindowSpec
    quantiles: tuple[float, ...]
    run_fingerprint: str
    window_fingerprint: str
    output: Location
    seasonality: int
    step_us: int
    rows_per_batch: int
    #: The run's checkpoints in order, each ``(name, fingerprint)``; the first one's fans are drawn.
    models: tuple[tuple[str, str], ...] = ()
    fan_series: tuple[int, ...] = ()
    overlap_packing: bool | None = None  # None: when the session runs on a GPU (unmeasured there: docs/gpu.md)
    write_attempts: int = 3
    write_backoff_s: float = 0.5
    roles: CovariateRoles | None = None  # past-only and categorical covariate rows (:mod:`.data.window_covariates`)
    grouping: GroupedWindows | None = None  # ``--group-by``: the windows in group-major order (:mod:`.grouping`)
    vintaged: VintagedCovariates | None = None  # ``--covariate-data``: rows joined as of each cutoff
    in_sample_end_us: int | None = None  # windows with origins at or before it are scored apart (in-sample)
    include_in_sample: bool = False  # ... and also in the run's main scores


class PartReceipt(BaseModel):
    """What an actor reports for a finished part: counts, bytes and where its time went (a few hundred bytes)."""

    part: int
    windows: int
    rows: int
    part_bytes: int
    sums_bytes: int
    write_attempts: int
    models_computed: list[str] = Field(default_factory=list, description="Models run here (others read back).")
    nonfinite_windows: int = 0
    seconds: dict[str, float] = Field(
        description="read, pack, model (every model), table, score, write; pack overlaps model; in a run of "
        "several models, model:NAME too (each model's calls)"
    )
    node_id: str | None = None
    pid: int = Field(default_factory=os.getpid)
