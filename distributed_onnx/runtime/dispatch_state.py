"""The dispatcher's bookkeeping: which actor holds which item, attempts, deadlines (pure code, no Ray).

An actor runs its calls one after the other, so only the oldest call in flight on an actor (its *head*) is
running; the others wait behind it. A deadline therefore runs from when a call became its actor's head, and
when an actor is lost only its head is charged an attempt: the calls queued behind it never ran.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")


@dataclass(frozen=True)
class Attempt(Generic[Item]):
    actor_key: int
    item: Item
    item_key: int


@dataclass
class DispatchState(Generic[Item]):
    """Which actor holds which item, how loaded each actor is, what must run again, what is overdue.

    An actor runs its calls one after the other, so only the oldest call in flight on an actor (its *head*)
    is running; the others wait behind it. A deadline therefore runs from when a call became its actor's
    head, and when an actor is lost only its head is charged an attempt: the calls queued behind it never ran.
    """

    max_in_flight_per_actor: int
    max_attempts: int = 3
    load: dict[int, int] = field(default_factory=dict)
    retry: deque[Item] = field(default_factory=deque)
    attempts: dict[int, int] = field(default_factory=dict)
    in_flight: dict[Any, Attempt[Item]] = field(default_factory=dict)
    queues: dict[int, deque[Any]] = field(default_factory=dict)
    head_since: dict[int, float] = field(default_factory=dict)
    head_timeout_s: dict[int, float | None] = field(default_factory=dict)
    timeouts: dict[Any, float | None] = field(default_factory=dict)

    def add_actor(self, actor_key: int) -> None:
        self.load[actor_key] = 0

    def remove_actor(self, actor_key: int) -> None:
        self.load.pop(actor_key, None)

    def pick_actor(self) -> int | None:
        """The least-loaded live actor with room (lowest key on ties), or None when every actor is full."""
        open_actors = [(load, key) for key, load in self.load.items() if load < self.max_in_flight_per_actor]
        return min(open_actors)[1] if open_actors else None

    def submitted(
        self, ref: Any, actor_key: int, item: Item, item_key: int, *, now: float = 0.0, timeout_s: float | None = None
    ) -> None:
        self.in_flight[ref] = Attempt(actor_key, item, item_key)
        self.timeouts[ref] = timeout_s
        self.load[actor_key] = self.load.get(actor_key, 0) + 1
        self.attempts[item_key] = self.attempts.get(item_key, 0) + 1
        queue = self.queues.setdefault(actor_key, deque())
        queue.append(ref)
        if len(queue) == 1:
            self._new_head(actor_key, now)

    def settled(self, ref: Any, now: float = 0.0) -> Attempt[Item]:
        attempt = self.in_flight.pop(ref)
        self.timeouts.pop(ref, None)
        if attempt.actor_key in self.load:
            self.load[attempt.actor_key] -= 1
        queue = self.queues.get(attempt.actor_key, deque())
        was_head = bool(queue) and queue[0] == ref
        if ref in queue:
            queue.remove(ref)
        if was_head:
            self._new_head(attempt.actor_key, now)
        return attempt

    def drop_actor(self, actor_key: int) -> list[Attempt[Item]]:
        """Forget every call in flight on a lost actor: its head keeps its attempt, the queued ones get theirs back."""
        queue = self.queues.pop(actor_key, deque())
        dropped = []
        for position, ref in enumerate(queue):
            attempt = self.in_flight.pop(ref)
            self.timeouts.pop(ref, None)
            if position > 0:
                self.attempts[attempt.item_key] -= 1
            dropped.append(attempt)
        self.head_since.pop(actor_key, None)
        self.head_timeout_s.pop(actor_key, None)
        self.remove_actor(actor_key)
        return dropped

    def can_retry(self, item_key: int) -> bool:
        return self.attempts.get(item_key, 0) < self.max_attempts

    def overdue(self, now: float) -> list[int]:
        """Actors whose running call (their head) has passed its deadline."""
        return [
            actor
            for actor, since in self.head_since.items()
            if (timeout := self.head_timeout_s.get(actor)) is not None and now - since >= timeout
        ]

    def next_deadline(self) -> float:
        deadlines = [
            since + timeout
            for actor, since in self.head_since.items()
            if (timeout := self.head_timeout_s.get(actor)) is not None
        ]
        return min(deadlines, default=float("inf"))

    def _new_head(self, actor_key: int, now: float) -> None:
        queue = self.queues.get(actor_key)
        if queue:
            self.head_since[actor_key] = now
            self.head_timeout_s[actor_key] = self.timeouts.get(queue[0])
        else:
            self.head_since.pop(actor_key, None)
            self.head_timeout_s.pop(actor_key, None)


@dataclass
class DispatchStats:
    """What one dispatch did, counted (``summary.json``'s ``parts`` section reports each field by name)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    actors_lost: int = 0
    deadlines_missed: int = 0
    replacements_started: int = 0
    replacements_ready: int = 0

    def as_record(self) -> dict[str, int]:
        return asdict(self)
