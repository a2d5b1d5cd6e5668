"""Which actor gets the run's last items: none that would finish them after the others are done (pure code).

A run ends when its last item does. Handing items to whichever actor has room is right while plenty is left,
and wrong at the end: a call queued behind a running one, or an item given to an actor five times slower than
the rest, finishes long after the others ran out of work (measured on the simulated fleet,
``benchmarks/results/fleet.md``). So, once the actors' speeds are known (work per second of their finished
calls, :meth:`~.dispatch_state.DispatchState.rate`), an item goes to an actor only if that actor would finish
it within the time the whole pool needs for what is left; otherwise it waits for another actor, except on an
idle actor of ordinary speed (at least ``slow_share`` of the median): waiting for a faster one would only
serialise the end. Slow actors are then benched for the rest of the run (the dispatcher brings them back if
nothing else runs). Every decision is O(1); the median speed is refreshed once per pool's worth of results.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TailPolicy:
    """The work left, in flight and done, and the pool's speed: whether an item should go to an actor now."""

    #: Work not yet submitted (the source's, and retries'); None: unknown (a source of unknown length).
    left: float | None
    #: An actor slower than this share of the median gets no item that would outlast the run.
    slow_share: float = 0.5
    in_flight: float = 0.0
    done: float = 0.0
    median_rate: float | None = None
    #: The pool's speed: the sum of its actors' (an actor not measured yet counts as the median).
    pool_rate: float | None = None
    _results_since_median: int = field(default=0, repr=False)

    def took(self, size: float) -> None:
        if self.left is not None:
            self.left -= size
        self.in_flight += size

    def returned(self, size: float) -> None:
        """An item in flight comes back to the queue (its actor was lost)."""
        if self.left is not None:
            self.left += size
        self.in_flight -= size

    def finished(self, size: float, ok: bool = True) -> None:
        self.in_flight -= size
        if ok:
            self.done += size
            self._results_since_median += 1

    def needs_median(self, pool_size: int) -> bool:
        return self.median_rate is None or self._results_since_median >= max(pool_size, 1)

    def set_rates(self, rates: list[float], unmeasured: int) -> None:
        """The measured speeds of the live actors (and how many are not measured yet): the median and the sum."""
        rates = sorted(rates)
        self.median_rate = rates[len(rates) // 2] if rates else None
        self.pool_rate = sum(rates) + unmeasured * self.median_rate if self.median_rate is not None else None
        self._results_since_median = 0

    def seconds_left(self) -> float | None:
        """How long the pool needs for what is left at its actors' speeds (None: not known yet)."""
        if self.left is None or not self.pool_rate:
            return None
        return (self.left + self.in_flight) / self.pool_rate

    def give(self, size: float, actor_rate: float | None, load: int, busy_for_s: float | None) -> bool:
        """Whether an actor should get an item now: ``load`` calls in flight that keep it busy ``busy_for_s``
        more, at its measured speed ``actor_rate`` (None: not measured yet)."""
        if actor_rate is None or actor_rate <= 0 or busy_for_s is None:
            return load == 0  # not measured yet: one call at a time until its first result says how fast it is
        left_s = self.seconds_left()
        if left_s is None:
            return True  # the pool's speed is not known yet: no reason to hold back
        if busy_for_s + size / actor_rate <= left_s:
            return True  # it finishes this one (and what it holds) before the pool runs dry
        if load:
            return False  # queued behind a running call, it would finish last: another actor takes it
        return self.median_rate is None or actor_rate >= self.slow_share * self.median_rate
