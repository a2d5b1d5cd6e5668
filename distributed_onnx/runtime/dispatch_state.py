"""The dispatcher's bookkeeping: which actor holds which item, attempts, deadlines (pure code, no Ray).

An actor runs its calls one after the other, so only the oldest call in flight on an actor (its *head*) is
running; the others wait behind it. A deadline therefore runs from when a call became its actor's head, and
when an actor is lost only its head is charged an attempt: the calls queued behind it never ran.

Every operation costs O(log actors) per call, not O(actors): the least-loaded actor and the next deadline come
from heaps whose stale entries are dropped when they reach the top. A driver of a thousand actors picks an
actor and looks at the deadlines for every part it submits and every result it settles.
"""

from __future__ import annotations

import heapq
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
    #: ``(load, actor)`` of actors with room; an entry whose load is no longer the actor's is stale.
    _open: list[tuple[int, int]] = field(default_factory=list, repr=False)
    #: ``(deadline, actor, head number)`` of running calls with a deadline; stale once the actor's head changed.
    _deadlines: list[tuple[float, int, int]] = field(default_factory=list, repr=False)
    _head_number: dict[int, int] = field(default_factory=dict, repr=False)
    _heads: int = field(default=0, repr=False)
    #: Actors the dispatcher no longer picks (slow ones, in the tail), their work done and time spent on it.
    benched: set[int] = field(default_factory=set)
    work_done: dict[int, float] = field(default_factory=dict)
    #: Work in flight per actor (the sizes given at submission), and per call.
    work_queued: dict[int, float] = field(default_factory=dict)
    sizes: dict[Any, float] = field(default_factory=dict, repr=False)
    busy_s: dict[int, float] = field(default_factory=dict)

    def add_actor(self, actor_key: int) -> None:
        self.load[actor_key] = 0
        self._opened(actor_key)

    def remove_actor(self, actor_key: int) -> None:
        self.load.pop(actor_key, None)

    def pick_actor(self) -> int | None:
        """The least-loaded live actor with room (lowest key on ties), or None when every actor is full (benched
        actors are never picked)."""
        heap = self._open
        while heap:
            load, key = heap[0]
            if self.load.get(key) == load and load < self.max_in_flight_per_actor and key not in self.benched:
                return key
            heapq.heappop(heap)  # stale: the actor's load changed (or it is gone) since this entry
        return None

    def bench(self, actor_key: int) -> None:
        """Pick this actor no more (until :meth:`unbench_all`): the dispatcher keeps the tail off slow actors."""
        self.benched.add(actor_key)

    def unbench(self, actor_keys: list[int]) -> None:
        for actor_key in actor_keys:
            self.benched.discard(actor_key)
            self._opened(actor_key)

    def unbench_all(self) -> None:
        self.unbench(list(self.benched))

    def rate(self, actor_key: int) -> float | None:
        """Work per second of an actor's finished calls (their size over their time as its head), if known."""
        busy = self.busy_s.get(actor_key, 0.0)
        return self.work_done[actor_key] / busy if busy > 0 and actor_key in self.work_done else None

    def time_to_free_s(self, actor_key: int, now: float) -> float | None:
        """When an actor would finish what it holds, at its measured speed (None: not measured)."""
        rate = self.rate(actor_key)
        if rate is None:
            return None
        running_s = now - self.head_since[actor_key] if actor_key in self.head_since else 0.0
        return max(self.work_queued.get(actor_key, 0.0) / rate - running_s, 0.0)

    def _unqueue(self, ref: Any, actor_key: int) -> None:
        size = self.sizes.pop(ref, None)
        if size is not None and actor_key in self.work_queued:
            self.work_queued[actor_key] -= size

    def _opened(self, actor_key: int) -> None:
        """Note an actor's new load, if it has room; rebuilds the heap when stale entries outnumber live ones."""
        load = self.load.get(actor_key)
        if load is None or load >= self.max_in_flight_per_actor or actor_key in self.benched:
            return
        heapq.heappush(self._open, (load, actor_key))
        if len(self._open) > 4 * len(self.load) + 64:
            self._open = [(n, key) for key, n in self.load.items() if n < self.max_in_flight_per_actor]
            heapq.heapify(self._open)

    def submitted(
        self,
        ref: Any,
        actor_key: int,
        item: Item,
        item_key: int,
        *,
        now: float = 0.0,
        timeout_s: float | None = None,
        size: float | None = None,
    ) -> None:
        self.in_flight[ref] = Attempt(actor_key, item, item_key)
        if size is not None:
            self.sizes[ref] = size
            self.work_queued[actor_key] = self.work_queued.get(actor_key, 0.0) + size
        self.timeouts[ref] = timeout_s
        self.load[actor_key] = self.load.get(actor_key, 0) + 1
        self._opened(actor_key)
        self.attempts[item_key] = self.attempts.get(item_key, 0) + 1
        queue = self.queues.setdefault(actor_key, deque())
        queue.append(ref)
        if len(queue) == 1:
            self._new_head(actor_key, now)

    def settled(self, ref: Any, now: float = 0.0, size: float | None = None) -> Attempt[Item]:
        """A call finished (its result, or its job's error); ``size``: its work, counted into the actor's rate."""
        attempt = self.in_flight.pop(ref)
        self.timeouts.pop(ref, None)
        self._unqueue(ref, attempt.actor_key)
        if attempt.actor_key in self.load:
            self.load[attempt.actor_key] -= 1
            self._opened(attempt.actor_key)
        queue = self.queues.get(attempt.actor_key, deque())
        was_head = bool(queue) and queue[0] == ref
        if ref in queue:
            queue.remove(ref)
        if was_head:
            if size is not None and attempt.actor_key in self.head_since:
                key = attempt.actor_key
                self.work_done[key] = self.work_done.get(key, 0.0) + size
                self.busy_s[key] = self.busy_s.get(key, 0.0) + now - self.head_since[key]
            self._new_head(attempt.actor_key, now)
        return attempt

    def drop_actor(self, actor_key: int) -> list[Attempt[Item]]:
        """Forget every call in flight on a lost actor: its head keeps its attempt, the queued ones get theirs back."""
        queue = self.queues.pop(actor_key, deque())
        dropped = []
        for position, ref in enumerate(queue):
            attempt = self.in_flight.pop(ref)
            self.timeouts.pop(ref, None)
            self._unqueue(ref, actor_key)
            if position > 0:
                self.attempts[attempt.item_key] -= 1
            dropped.append(attempt)
        self.head_since.pop(actor_key, None)
        self.head_timeout_s.pop(actor_key, None)
        self._head_number.pop(actor_key, None)
        self.remove_actor(actor_key)
        return dropped

    def can_retry(self, item_key: int) -> bool:
        return self.attempts.get(item_key, 0) < self.max_attempts

    def overdue(self, now: float) -> list[int]:
        """Actors whose running call (their head) has passed its deadline."""
        self._drop_stale_deadlines()
        heap, late = self._deadlines, []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._head_number.get(entry[1]) == entry[2]:
                late.append(entry)
        for entry in late:  # still overdue until the caller drops the actor (or its head settles)
            heapq.heappush(heap, entry)
        return sorted(actor for _, actor, _ in late)

    def next_deadline(self) -> float:
        self._drop_stale_deadlines()
        return self._deadlines[0][0] if self._deadlines else float("inf")

    def _drop_stale_deadlines(self) -> None:
        heap = self._deadlines
        while heap and self._head_number.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)

    def _new_head(self, actor_key: int, now: float) -> None:
        queue = self.queues.get(actor_key)
        self._heads += 1
        if queue:
            timeout = self.timeouts.get(queue[0])
            self.head_since[actor_key] = now
            self.head_timeout_s[actor_key] = timeout
            self._head_number[actor_key] = self._heads
            if timeout is not None:
                heapq.heappush(self._deadlines, (now + timeout, actor_key, self._heads))
        else:
            self.head_since.pop(actor_key, None)
            self.head_timeout_s.pop(actor_key, None)
            self._head_number.pop(actor_key, None)


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
