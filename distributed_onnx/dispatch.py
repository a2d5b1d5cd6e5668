"""Fan-out of batches over worker actors: bounded in flight, least-loaded first, lost work re-run.

The bookkeeping (:class:`DispatchState`) is plain code with no Ray in it; :func:`dispatch` is the thin loop
that submits, waits and routes outcomes. Each batch has at most one attempt in flight, and its result is
delivered once, so no batch is written twice. When an actor (or its node) dies, its batches go back to the
queue and run elsewhere; a batch that *fails* (the model raised) is reported and not retried.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

from distributed_onnx.errors import BatchError

logger = logging.getLogger(__name__)

Item = TypeVar("Item")


@dataclass
class DispatchState(Generic[Item]):
    """Which actor holds which item, how loaded each actor is, what must run again."""

    max_in_flight_per_actor: int
    max_attempts: int = 3
    load: dict[int, int] = field(default_factory=dict)
    retry: deque[Item] = field(default_factory=deque)
    attempts: dict[int, int] = field(default_factory=dict)
    in_flight: dict[Any, tuple[int, Item]] = field(default_factory=dict)

    def add_actor(self, actor_key: int) -> None:
        self.load[actor_key] = 0

    def remove_actor(self, actor_key: int) -> None:
        self.load.pop(actor_key, None)

    def pick_actor(self) -> int | None:
        """The least-loaded live actor with room, or None when every actor is full."""
        open_actors = [(load, key) for key, load in self.load.items() if load < self.max_in_flight_per_actor]
        return min(open_actors)[1] if open_actors else None

    def submitted(self, ref: Any, actor_key: int, item: Item, item_key: int) -> None:
        self.in_flight[ref] = (actor_key, item)
        self.load[actor_key] = self.load.get(actor_key, 0) + 1
        self.attempts[item_key] = self.attempts.get(item_key, 0) + 1

    def settled(self, ref: Any) -> tuple[int, Item]:
        actor_key, item = self.in_flight.pop(ref)
        if actor_key in self.load:
            self.load[actor_key] -= 1
        return actor_key, item

    def can_retry(self, item_key: int) -> bool:
        return self.attempts.get(item_key, 0) < self.max_attempts


@dataclass
class DispatchStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    actors_lost: int = 0


class _Pool:
    """Live actors by key, with replacement of dead ones."""

    def __init__(self, actors: list[Any], state: DispatchState[Any], replace: Callable[[], Any | None] | None) -> None:
        self.actors: dict[int, Any] = {}
        self._state = state
        self._replace = replace
        self._next_key = 0
        for actor in actors:
            self.add(actor)

    def add(self, actor: Any) -> None:
        self.actors[self._next_key] = actor
        self._state.add_actor(self._next_key)
        self._next_key += 1

    def lose(self, actor_key: int, reason: str) -> bool:
        """Drop a dead actor (once) and start a replacement if possible; True if it was still in the pool."""
        if actor_key not in self.actors:
            return False
        logger.warning("Worker actor %d lost (%s); re-queueing its batches", actor_key, reason)
        del self.actors[actor_key]
        self._state.remove_actor(actor_key)
        replacement = self._replace() if self._replace is not None else None
        if replacement is not None:
            self.add(replacement)
        return True


def dispatch(
    items: Iterator[Item],
    actors: list[Any],
    submit: Callable[[Any, Item], Any],
    on_result: Callable[[Item, Any], None],
    on_failure: Callable[[Item, BaseException], None],
    *,
    key: Callable[[Item], int],
    max_in_flight_per_actor: int = 2,
    max_attempts: int = 3,
    replace_actor: Callable[[], Any | None] | None = None,
    poll_timeout_s: float = 1.0,
) -> DispatchStats:
    """Run every item on the actor pool, pulling items lazily so memory stays bounded.

    ``submit(actor, item)`` returns an ObjectRef; ``on_result(item, value)`` gets each success once;
    ``on_failure(item, error)`` gets model errors and items that exhausted ``max_attempts`` because their
    actors kept dying. ``replace_actor()`` may start a replacement for a dead actor (None: shrink the pool).
    """
    state: DispatchState[Item] = DispatchState(max_in_flight_per_actor, max_attempts)
    pool = _Pool(actors, state, replace_actor)
    stats = DispatchStats()
    source = iter(items)
    exhausted = False
    while True:
        while (actor_key := state.pick_actor()) is not None:
            candidate = state.retry.popleft() if state.retry else (None if exhausted else next(source, None))
            if candidate is None:
                exhausted = True
                break
            state.submitted(submit(pool.actors[actor_key], candidate), actor_key, candidate, key(candidate))
            stats.submitted += 1
        if not state.in_flight:
            if exhausted and not state.retry:
                return stats
            if not pool.actors:
                raise BatchError(f"Every worker actor died; {len(state.retry)} queued batch(es) could not run.")
            continue
        ready, _ = ray.wait(list(state.in_flight), num_returns=1, timeout=poll_timeout_s)
        for ref in ready:
            _settle(ref, state, pool, stats, key, on_result, on_failure)


def _settle(
    ref: Any,
    state: DispatchState[Item],
    pool: _Pool,
    stats: DispatchStats,
    key: Callable[[Item], int],
    on_result: Callable[[Item, Any], None],
    on_failure: Callable[[Item, BaseException], None],
) -> None:
    """Route one finished attempt: a result, a lost actor (retry elsewhere) or a model error (report)."""
    actor_key, item = state.settled(ref)
    try:
        value = ray.get(ref)
    except (RayActorError, ObjectLostError, GetTimeoutError) as exc:
        if pool.lose(actor_key, type(exc).__name__):
            stats.actors_lost += 1
        if state.can_retry(key(item)):
            state.retry.append(item)
            stats.retried += 1
        else:
            stats.failed += 1
            on_failure(item, exc)
    except RayTaskError as exc:
        stats.failed += 1
        on_failure(item, exc.cause if exc.cause is not None else exc)
    else:
        stats.completed += 1
        on_result(item, value)
