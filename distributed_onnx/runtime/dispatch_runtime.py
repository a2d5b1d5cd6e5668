"""What the dispatcher asks of Ray, and of the clock, in one small interface (so its loop runs without either).

The dispatcher (:mod:`distributed_onnx.runtime.dispatch`) waits for calls, reads their results, kills actors
and reads the time only through a :class:`DispatchRuntime`. In a run it is :class:`RayRuntime`; the fleet
benchmark (``benchmarks/fleet_sim.py``) gives it a simulated cluster on a fake clock, so that the real loop and
bookkeeping are measured at a thousand actors on a machine of two cores.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import ray

__all__ = ["SWEEP_FROM", "DispatchRuntime", "RayRuntime"]

#: From this many calls waited on, a wait that found one ready result also collects, without waiting, every
#: other one ready by then: one pass over the refs per batch of results rather than one per result.
SWEEP_FROM = 8


class DispatchRuntime(Protocol):
    """The dispatcher's view of Ray and of time."""

    def wait(self, refs: Sequence[Any], timeout_s: float, linger_s: float = 0.0) -> list[Any]:
        """The refs ready within ``timeout_s`` (at least one, unless the time ran out), and once one is, every
        other ready within ``linger_s`` more."""
        ...

    def get(self, ref: Any) -> Any:
        """The value of a ready ref; raises what the call raised (Ray's exception types)."""
        ...

    def kill(self, actor: Any) -> None:
        """Stop an actor now (raises if it is already gone)."""
        ...

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def sleep(self, seconds: float) -> None: ...


class RayRuntime:
    """The dispatcher's runtime in a real run: Ray's ``wait``, ``get`` and ``kill``, and the monotonic clock."""

    def wait(self, refs: Sequence[Any], timeout_s: float, linger_s: float = 0.0) -> list[Any]:
        refs = list(refs)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if ready and rest and (linger_s > 0 or len(refs) >= SWEEP_FROM):
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=linger_s)
            ready += more
        return list(ready)

    def get(self, ref: Any) -> Any:
        return ray.get(ref)

    def kill(self, actor: Any) -> None:
        ray.kill(actor)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
