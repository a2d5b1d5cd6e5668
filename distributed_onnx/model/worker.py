"""InferenceWorker: one backend + its family adapter, turning windows into quantile forecasts.

A plain class with no Ray import: the backtest's actors and the Serve replicas wrap the same object, which is
what makes an online forecast equal the backtest forecast for the same window. Windows come in on the run's
grid (``context_length`` <= the model's, ``horizon`` <= the model's); the worker lays them out on the model's
grid (missing history on the left, masked future on the right), runs the backend, cuts the horizon back and
resamples the native quantiles onto the requested ones. A horizon shorter than one call gets what the family's
pipeline computes for it (:mod:`distributed_onnx.model.horizons`): the call's first steps, a call of fewer output
patches, or a refusal; never a silent cut of a forecast that differs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.model.adapters import ModelAdapter, adapter_for
from distributed_onnx.model.adapters.grouping import GroupingAdapter
from distributed_onnx.model.backend.policy import HostCapabilities
from distributed_onnx.model.backend.protocol import InferenceBackend
from distributed_onnx.model.backend.providers import ExecutionProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import CheckpointMetadata, LocalCheckpoint
from distributed_onnx.model.horizons import call_metadata, short_horizon_problem
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE, interpolate_quantiles
from distributed_onnx.model.unroll import unroll
from distributed_onnx.model.window_batch import unpack_batch

logger = logging.getLogger(__name__)


def call_levels(call: CheckpointMetadata, quantiles: Sequence[float]) -> CheckpointMetadata:
    """The checkpoint as a call computing ``quantiles`` sees it: a graph that emits a distribution
    (``output_distribution``: its adapter computes each native level on its own, Toto's mixture) computes only
    the native levels the run asks when it asks native levels only: the same values (each level's root is its
    own), a third of the work for 3 of 9 levels. Any other graph emits its native levels: ``call`` itself.

    >>> from distributed_onnx.model.checkpoint import CheckpointMetadata
    >>> toto = CheckpointMetadata(
    ...     model_family="toto", input_names=["context"], output_name="student_t_mixture",
    ...     native_quantiles=[0.1, 0.2, 0.5, 0.8, 0.9], context_length=8, output_patch_size=4, horizon_patches=1,
    ...     resolution_minutes=60, missing_value="nan", output_distribution="student_t_mixture")
    >>> call_levels(toto, [0.9, 0.1, 0.5]).native_quantiles
    [0.1, 0.5, 0.9]
    >>> call_levels(toto, [0.05, 0.5]).native_quantiles  # a level between or beyond native ones: all of them
    [0.1, 0.2, 0.5, 0.8, 0.9]
    """
    if call.output_distribution is None:
        return call
    asked = [level for level in call.native_quantiles if any(abs(level - q) <= LEVEL_TOLERANCE for q in quantiles)]
    if len(asked) != len(set(quantiles)) or asked == call.native_quantiles:
        return call
    return call.model_copy(update={"native_quantiles": asked})


class WorkerConfig(BaseModel):
    """Everything a worker needs to build itself; small and picklable, so it travels to actors."""

    model_config = ConfigDict(frozen=True)

    checkpoint: Path = Field(description="The .onnx file; its metadata JSON sits beside it.")
    metadata_path: Path | None = Field(default=None, description="Metadata JSON, if not beside the weights.")
    providers: list[ExecutionProvider] | None = Field(
        default=None, description="Explicit provider chain (strict); None lets the policy choose (graceful)."
    )
    session_options: SessionOptionsConfig = Field(default_factory=SessionOptionsConfig)
    warm_up_rows: int = Field(default=8, ge=0, description="Rows of the warm-up run (0 skips it).")


class WorkerInfo(BaseModel):
    """What a worker realized, for reports: providers, threads, devices, where it runs."""

    model_name: str
    checkpoint_sha256: str | None
    providers: list[str]
    intra_op_num_threads: int | None
    gpu_ids: list[str] = Field(default_factory=list, description="GPUs Ray assigned (physical ids).")
    cuda_visible_devices: str | None = None
    node_id: str | None = None
    pid: int = Field(default_factory=os.getpid)
    warm_up_s: float | None = None


class InferenceWorker:
    """Owns one backend and the adapter of its model family."""

    def __init__(self, backend: InferenceBackend, model_name: str = "model") -> None:
        self._backend = backend
        self._metadata = backend.metadata
        self._adapter: ModelAdapter = adapter_for(backend.metadata)
        #: Adapters of calls of fewer output patches (``short_horizon: output_patches``), by patch count.
        whole = (backend.metadata.horizon_patches, tuple(backend.metadata.native_quantiles))
        self._call_adapters: dict[tuple[int, tuple[float, ...]], ModelAdapter] = {whole: self._adapter}
        self._model_name = model_name

    @classmethod
    def from_config(cls, config: WorkerConfig, host: HostCapabilities | None = None) -> InferenceWorker:
        """Resolve the checkpoint and build an :class:`OnnxBackend` for it."""
        from distributed_onnx.model.backend.onnx import OnnxBackend

        resolved = LocalCheckpoint(path=config.checkpoint, metadata_path=config.metadata_path).resolve()
        backend = OnnxBackend.from_checkpoint(resolved, config.providers, config.session_options, host=host)
        return cls(backend, model_name=resolved.name)

    @property
    def metadata(self) -> CheckpointMetadata:
        return self._metadata

    @property
    def backend(self) -> InferenceBackend:
        return self._backend

    @property
    def adapter(self) -> ModelAdapter:
        """The model family's adapter (its tensor layout and its rule for NaN/inf in tensors)."""
        return self._adapter

    @property
    def model_name(self) -> str:
        return self._model_name

    def forecast(
        self,
        context: np.ndarray,
        horizon: int,
        quantiles: Sequence[float],
        covariates: np.ndarray | None = None,
        groups: np.ndarray | None = None,
    ) -> np.ndarray:
        """Quantile forecasts ``[W, horizon, len(quantiles)]`` (float32) for a block of windows.

        ``context`` is ``[W, C]`` (NaN = missing, oldest first; a longer history keeps its last
        ``context_length`` steps); ``covariates`` is ``[W, K, C + horizon]`` on the same grid plus the future;
        windows with equal ``groups`` are forecast jointly (an adapter with :class:`GroupingAdapter` only).
        """
        metadata = self._metadata
        longest = metadata.longest_horizon
        if longest is not None and horizon > longest:
            raise InputValidationError(
                f"horizon {horizon} exceeds what the model emits ({longest} steps"
                f"{'' if metadata.long_horizon == 'refuse' else ', its max_horizon_length'})",
                field="horizon",
            )
        problem = short_horizon_problem(metadata, horizon)
        if problem is not None:
            raise InputValidationError(f"{problem}.", field="horizon")
        if context.ndim != 2:
            raise InputValidationError(f"context must be [windows, steps], got shape {context.shape}")
        given = context.shape[1]
        model_grid = self._model_grid(context, given)
        call = call_metadata(metadata, horizon)  # the call's output patches: as the family's pipeline computes them
        model_covariates = None
        if covariates is not None and covariates.shape[1]:
            if not self._adapter.supports_covariates:
                raise InputValidationError(f"model_family {metadata.model_family!r} takes no covariates")
            model_covariates = self._covariate_grid(covariates, given, horizon, call.horizon_length)
        if horizon > metadata.horizon_length:  # several calls, as the family's pipeline makes them
            if model_covariates is not None or groups is not None:
                raise InputValidationError(
                    f"horizon {horizon} needs several calls of {metadata.horizon_length} steps, which this package "
                    "does only without covariates or groups: drop them or ask at most one call's horizon.",
                    field="horizon",
                )
            native = unroll(
                self._call,
                model_grid,
                horizon,
                strategy=metadata.long_horizon,
                native_quantiles=metadata.native_quantiles,
            )
            levels = metadata.native_quantiles
        else:
            call = call_levels(call, quantiles)  # a distribution's quantiles: only the levels the run asks
            native = self._call(model_grid, model_covariates, groups, call)[:, :, :horizon]  # [W, n_native, H]
            levels = call.native_quantiles
        return interpolate_quantiles(native.transpose(0, 2, 1), levels, quantiles)

    def _call(
        self,
        model_grid: np.ndarray,
        model_covariates: np.ndarray | None = None,
        groups: np.ndarray | None = None,
        call: CheckpointMetadata | None = None,
    ) -> np.ndarray:
        """One model call on the model's grid: ``[W, n_native, steps]``, the steps of ``call`` (the checkpoint as
        this call sees it, :func:`~distributed_onnx.model.horizons.call_metadata`; default the whole graph)."""
        adapter = self.adapter_of(call or self._metadata)
        if groups is None:
            inputs, target_rows = adapter.build_inputs(model_grid, model_covariates)
        elif isinstance(adapter, GroupingAdapter):
            inputs, target_rows = adapter.build_grouped_inputs(model_grid, model_covariates, groups)
        else:
            raise InputValidationError(
                f"model_family {self._metadata.model_family!r} cannot forecast groups of windows"
            )
        outputs = self._backend.run(inputs)
        return adapter.decode(outputs, target_rows)

    def adapter_of(self, call: CheckpointMetadata) -> ModelAdapter:
        """The adapter laying out a call of ``call.horizon_patches`` output patches and decoding its
        ``native_quantiles`` (built once per count and levels)."""
        key = (call.horizon_patches, tuple(call.native_quantiles))
        adapter = self._call_adapters.get(key)
        if adapter is None:
            adapter = self._call_adapters[key] = adapter_for(call)
        return adapter

    def forecast_batch(
        self, batch: pa.RecordBatch, context_length: int, horizon: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        """:meth:`forecast` over an Arrow batch made by :func:`distributed_onnx.evaluation.data.packing.pack_batch`."""
        block = unpack_batch(batch, context_length, horizon)
        return self.forecast(block.context, horizon, quantiles, block.covariates, block.groups)

    def warm_up(self, rows: int = 8) -> float:
        """Run one all-missing batch so the first real batch does not pay for lazy initialisation."""
        started = time.perf_counter()
        rows = self._fixed_windows() or rows
        context = np.full((rows, self._metadata.context_length), np.nan, dtype=np.float32)
        context[:, -1] = 0.0
        self.forecast(context, self._metadata.horizon_length, self._metadata.native_quantiles)
        return time.perf_counter() - started

    def fixed_windows(self) -> int | None:
        """Windows per call of a graph whose batch axis is fixed (static shapes), else None: such a graph takes
        exactly that many windows per call, every other count is refused by ONNX Runtime's input check."""
        return self._fixed_windows()

    def _fixed_windows(self) -> int | None:
        """Windows per batch of a graph whose batch axis is fixed (static shapes), else None.

        A static-shape graph accepts exactly that many rows, so a warm-up with any other count would fail.
        """
        name = self._metadata.input_names[0]
        specs = self._backend.input_specs
        fixed = next((spec.shape[0] for spec in specs if spec.name == name and spec.shape), None)
        if not isinstance(fixed, int):
            return None
        probe, _ = self._adapter.build_inputs(np.zeros((1, self._metadata.context_length), np.float32), None)
        return max(1, fixed // probe[name].shape[0])

    def info(self, **placement: Any) -> WorkerInfo:
        providers = list(self._backend.providers)
        return WorkerInfo(
            model_name=self._model_name,
            checkpoint_sha256=self._metadata.sha256,
            providers=providers,
            intra_op_num_threads=placement.pop("intra_op_num_threads", None),
            **placement,
        )

    def close(self) -> None:
        self._backend.close()

    def _model_grid(self, context: np.ndarray, given: int) -> np.ndarray:
        length = self._metadata.context_length
        if given >= length:
            return np.ascontiguousarray(context[:, given - length :], dtype=np.float32)
        grid = np.full((context.shape[0], length), np.nan, dtype=np.float32)
        grid[:, length - given :] = context
        return grid

    def _covariate_grid(self, covariates: np.ndarray, given: int, horizon: int, model_horizon: int) -> np.ndarray:
        """``covariates`` on the model's grid: its context, then ``model_horizon`` future steps (the call's)."""
        length = self._metadata.context_length
        if covariates.ndim != 3 or covariates.shape[2] != given + horizon:
            raise InputValidationError(
                f"covariates must be [windows, covariates, {given} + {horizon}] (context + horizon), "
                f"got shape {covariates.shape}"
            )
        n_windows, n_covariates = covariates.shape[:2]
        grid = np.full((n_windows, n_covariates, length + model_horizon), np.nan, dtype=np.float32)
        kept = min(given, length)
        grid[:, :, length - kept : length] = covariates[:, :, given - kept : given]
        grid[:, :, length : length + horizon] = covariates[:, :, given:]
        return grid


def check_run_fits_model(metadata: CheckpointMetadata, context_length: int, horizon: int) -> None:
    """Refuse a run whose context or horizon is longer than the checkpoint allows, or whose horizon it would
    forecast otherwise than its family's pipeline does (before any actor starts)."""
    longest = metadata.longest_horizon
    if longest is not None and horizon > longest:
        how = (
            f"({metadata.horizon_length} = {metadata.output_patch_size} x {metadata.horizon_patches}) in one call, "
            "and its long_horizon is 'refuse'"
            if metadata.long_horizon == "refuse"
            else f"(max_horizon_length {longest}, unrolled by {metadata.long_horizon!r})"
        )
        raise ConfigError(
            f"horizon {horizon} is longer than the checkpoint emits {how}: {metadata.horizon_hint}", key="horizon"
        )
    problem = short_horizon_problem(metadata, horizon)
    if problem is not None:
        raise ConfigError(problem, key="horizon")
    if context_length > metadata.context_length:
        raise ConfigError(
            f"context_length {context_length} is longer than the checkpoint takes ({metadata.context_length})",
            key="context_length",
        )
