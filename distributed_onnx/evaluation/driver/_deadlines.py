"""Deadlines that fit the work: how long one attempt at a unit of work may run before its actor is killed.

Pure code, no Ray and no clock, beside its one user: the driver's part ledger (:mod:`._part_ledger`) asks
:meth:`AttemptDeadlines.deadline_s` when the dispatcher submits a unit of ``size`` work items (a backtest part:
its windows) and reports each finished unit to :meth:`AttemptDeadlines.observe`.

Why per item, not per unit: units differ in size. A backtest's parts ramp up from one model batch, doubling,
to ~62 batches. A deadline of "10x the slowest unit so far" (at least 120 s) gave a 62-batch part, submitted
while only 4-batch parts had finished, 10 x 12 s = 120 s at 3 s a batch (a real Chronos-2 on CPU) when it
needs 186 s: a healthy actor was killed and the part's attempts used up. So the deadline is the unit's size
times the slowest rate per item observed so far, times a safety factor, and never below a floor (which
covers start-up costs a small unit cannot show: a first call, a cold cache). Before any unit has finished
there is no rate: the first deadline is generous and fixed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AttemptDeadlines:
    """The deadline of each attempt, from its size and the slowest rate per item finished so far."""

    factor: float = 10.0
    """Safety factor over the slowest rate seen (a slow node, a loaded machine, a noisy neighbour)."""
    floor_s: float = 120.0
    """No deadline is shorter than this."""
    first_s: float = 1800.0
    """The deadline before any unit has finished (no rate is known yet)."""
    slowest_s_per_item: float | None = None
    """The slowest rate observed so far: seconds per item of a finished unit."""

    def observe(self, size: int, seconds: float) -> None:
        """A unit of ``size`` items finished in ``seconds`` (its own running time, not its wait in a queue)."""
        if size <= 0 or seconds < 0:
            return
        rate = seconds / size
        self.slowest_s_per_item = rate if self.slowest_s_per_item is None else max(self.slowest_s_per_item, rate)

    def deadline_s(self, size: int) -> float:
        """How long an attempt at a unit of ``size`` items may run."""
        if self.slowest_s_per_item is None:
            return max(self.first_s, self.floor_s)
        return max(self.floor_s, self.factor * self.slowest_s_per_item * max(size, 1))
