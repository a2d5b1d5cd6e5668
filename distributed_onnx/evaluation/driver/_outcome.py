"""What one invocation of a run did, as data: the driver's record of it once the parts are in.

The run collects it while parts come back and freezes it before anything is written from it; ``summary.json``
is built from an outcome, a :class:`~distributed_onnx.evaluation.driver.clock.PhaseClock` and the plan, never from
the run's working state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed_onnx.evaluation.part_messages import PartReceipt
from distributed_onnx.model.worker import WorkerInfo
from distributed_onnx.runtime.dispatch_state import DispatchStats

__all__ = ["Dispatched", "PartFailure", "RunOutcome"]


@dataclass(frozen=True)
class PartFailure:
    """A part that this invocation could not compute, and why (``summary.json``: ``failed_parts``)."""

    part: int
    windows: int
    error: str

    @classmethod
    def of(cls, part: int, windows: int, error: BaseException) -> PartFailure:
        return cls(part, windows, f"{type(error).__name__}: {error}")

    def as_record(self) -> dict[str, Any]:
        return {"part": self.part, "windows": self.windows, "error": self.error}


@dataclass(frozen=True)
class Dispatched:
    """What dispatching left besides the receipts: the pool as it started, the transport, the counters."""

    workers: tuple[WorkerInfo, ...]
    transport: Mapping[str, Any]
    stats: DispatchStats


@dataclass(frozen=True)
class RunOutcome:
    """One invocation of a run: what was done before it, what it computed and failed, on which workers, how."""

    #: Parts of the plan, and of those the ones an earlier invocation had already written and verified.
    parts_planned: int
    parts_done_before: int
    windows_done_before: int
    receipts: tuple[PartReceipt, ...] = ()
    failures: tuple[PartFailure, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    #: How the series reached the actors (``summary.json``: ``transport``, before the receipts' byte counts).
    transport: Mapping[str, Any] = field(default_factory=dict)
    dispatch_stats: DispatchStats = field(default_factory=DispatchStats)
    #: Seconds from the start of the job (Ray start-up included) to the first receipt; None if none came.
    first_result_s: float | None = None

    @property
    def windows_computed(self) -> int:
        return sum(receipt.windows for receipt in self.receipts)

    @property
    def windows_failed(self) -> int:
        return sum(failure.windows for failure in self.failures)
