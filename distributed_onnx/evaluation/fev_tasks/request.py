"""``distributed-onnx fev``'s settings: the benchmark, the checkpoints, the output, and the backtest settings a fev
task does not decide.

The backtest settings it shares are :class:`~distributed_onnx.evaluation.settings.BacktestSettings`' own fields,
copied with their descriptions and bounds rather than written again: ``checkpoint``, ``clamp_quantiles``, and
every setting of the actor pools the benchmark's runs share (where Ray is, how many actors of what shape, the
ONNX Runtime sessions they build, the deadlines of their start), so that a pool that cannot start in a fev run
stops within the deadline a user can set, as a backtest's does. The Python API (``distributed_onnx.fev_benchmark``)
takes any other backtest setting besides; the command takes these.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import CliPositionalArg

from distributed_onnx.evaluation.settings import BacktestSettings, gpu_chain_problem
from distributed_onnx.location import Location
from distributed_onnx.model.backend.providers import ExecutionProvider
from distributed_onnx.model.checkpoint import checkpoint_paths, local_checkpoints
from distributed_onnx.own_inputs import Read, Written, check_own_inputs, checkpoint_files
from distributed_onnx.runtime.addresses import check_address_or_none
from distributed_onnx.settings_flags import flag_name
from distributed_onnx.settings_sources import CommandSettings

__all__ = ["FevRequest"]

#: The fields shared with the backtest that each run takes from the benchmark's plan, not as given here.
_PLANNED = frozenset({"checkpoint", "output"})


def _backtest_field(name: str, description: str | None = None) -> Any:
    """The backtest's own field ``name`` (its type is restated where it is used; its default and bounds are the
    backtest's, and its help unless ``description`` says what it means here)."""
    field: FieldInfo = copy.copy(BacktestSettings.model_fields[name])
    if description is not None:
        field.description = description
    return field


class FevRequest(CommandSettings):
    """Run every task of a fev benchmark YAML against each checkpoint as backtests on Ray, score them with fev's
    own Task.evaluation_summary and write OUTPUT/summaries.jsonl (docs/fev.md). Rerun to resume or to add a
    checkpoint."""

    label: ClassVar[str] = "fev settings"

    benchmark: CliPositionalArg[Location] = Field(
        examples=["BENCHMARK.yaml"], description="fev benchmark YAML (a 'tasks' list), a path or a URL."
    )
    checkpoint: list[Path] = _backtest_field("checkpoint")
    output: Location = Field(
        examples=["DIR"],
        description="Output directory, a path or a URL: summaries.jsonl, fev_summary.json, runs/. Rerun it to resume.",
    )
    actors: int | None = _backtest_field("actors")
    cpus_per_actor: float = _backtest_field("cpus_per_actor")
    gpus_per_actor: float = _backtest_field("gpus_per_actor")
    providers: list[ExecutionProvider] | None = _backtest_field("providers")  # its parsing comes with the field
    graph_optimization: Literal["basic", "extended", "all"] = _backtest_field("graph_optimization")
    placement_timeout_s: float = _backtest_field("placement_timeout_s")
    ready_timeout_s: float = _backtest_field("ready_timeout_s")
    address: str | None = _backtest_field("address")
    clamp_quantiles: bool = _backtest_field(
        "clamp_quantiles",
        "Forecast a task's quantile levels outside a checkpoint's native range as the nearest native level (its "
        "interval is narrower than its name says; noted in the run's summary.json and report). Without it such a "
        "task x checkpoint is skipped, with the reason.",
    )

    _local = field_validator("checkpoint", mode="before")(local_checkpoints)  # as the backtest's: local files

    @field_validator("checkpoint")
    @classmethod
    def _checkpoints(cls, value: list[Path]) -> list[Path]:
        found = checkpoint_paths(value)  # as backtest --checkpoint: a folder is every checkpoint in it
        if not found:
            raise ValueError("give at least one checkpoint")
        return found

    _ray_address = field_validator("address")(check_address_or_none)  # the backtest's one parse

    @field_validator("providers")
    @classmethod
    def _gpu_chain_needs_gpus(
        cls, value: list[ExecutionProvider] | None, info: ValidationInfo
    ) -> list[ExecutionProvider] | None:
        problem = gpu_chain_problem(value, info.data.get("gpus_per_actor"))  # as the backtest's settings
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _writes_no_input(self) -> FevRequest:
        """``--output`` never lands on what fev reads (:mod:`distributed_onnx.own_inputs`): the benchmark YAML, the
        checkpoints' files."""
        inputs = [
            Read(flag_name(type(self), "benchmark"), self.benchmark),
            *(checkpoint_files(path, "checkpoint") for path in self.checkpoint),
        ]
        written = ("summaries.jsonl", "summaries.json", "fev_summary.json", "runs")
        check_own_inputs([Written("output", self.output, written)], inputs)
        return self

    def backtest_settings(self) -> dict[str, Any]:
        """The backtest settings each of the benchmark's runs takes from these: every field copied from the
        backtest's (but the checkpoints, which the runs take from the tasks' plan), given or not default."""
        return {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name in BacktestSettings.model_fields and name not in _PLANNED and name in self.model_fields_set
        }
