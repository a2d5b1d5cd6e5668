"""Fan-out of small work descriptors over worker actors: bounded in flight, deadlines, lost work re-run.

The bookkeeping (:class:`DispatchState`) is plain code with no Ray in it; :func:`dispatch` is the loop that
submits, waits and routes outcomes. Each item has at most one attempt in flight and its result is delivered
once. When an actor (or its node) dies, or an attempt outlives its deadline (the actor is then killed: a hung
call is a lost call), the item goes back to the queue and runs elsewhere, at most ``max_attempts`` times; an
item that *fails* (the job raised) is reported and not retried. A lost actor's replacement starts in the
background: the loop keeps feeding the other actors while it warms up, and adds it once it is ready.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import ray
from ray.exceptions import (
    GetTimeoutError,
    NodeDiedError,
    ObjectLostError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from distributed_onnx.errors import BatchError
from distributed_onnx.runtime.dispatch_state import Attempt, DispatchState, DispatchStats, Item

logger = logging.getLogger(__name__)

#: Outcomes that mean "the actor or its node went away", not "the work is bad": run the item elsewhere.
LOST = (RayActorError, ObjectLostError, GetTimeoutError, WorkerCrashedError, NodeDiedError, OutOfMemoryError)


class Replacements(Protocol):
    """How the dispatcher gets a new actor for a lost one (implemented over :mod:`distributed_onnx.runtime.actors`)."""

    def has_room(self) -> bool:
        """Whether the cluster can place one more actor now (must not block)."""
        ...

    def start(self) -> tuple[Any, Any]:
        """Start an actor without waiting: ``(handle, ref that resolves when it is ready)``."""
        ...


class _Pool:
    """Live actors by key, actors being replaced, and replacements warming up."""

    def __init__(
        self,
        actors: list[Any],
        state: DispatchState[Any],
        replacements: Replacements | None,
        max_replacements: int,
        ready_timeout_s: float,
    ) -> None:
        self.actors: dict[int, Any] = {}
        self.warming: dict[Any, tuple[Any, float]] = {}  # ready ref -> (handle, deadline)
        self.wanted = 0
        self._state = state
        self._replacements = replacements
        self._budget = max_replacements
        self._ready_timeout_s = ready_timeout_s
        self._next_key = 0
        for actor in actors:
            self.add(actor)

    def add(self, actor: Any) -> None:
        self.actors[self._next_key] = actor
        self._state.add_actor(self._next_key)
        self._next_key += 1

    def lose(self, actor_key: int, reason: str, kill: bool = False) -> bool:
        """Drop a dead (or hung: ``kill``) actor once and ask for a replacement; True if it was in the pool."""
        actor = self.actors.pop(actor_key, None)
        if actor is None:
            return False
        logger.warning("Worker actor %d lost (%s); its work runs again elsewhere", actor_key, reason)
        self._state.remove_actor(actor_key)
        if kill:
            ray.kill(actor)
        if self._replacements is not None and self._budget > 0:
            self.wanted += 1
        return True

    def start_wanted(self, stats: DispatchStats, on_replacement: Callable[[Any], None] | None) -> None:
        """Start the replacements asked for, as far as the cluster has room now (never waits)."""
        while self.wanted and self._budget > 0 and self._replacements is not None and self._replacements.has_room():
            handle, ready = self._replacements.start()
            self.warming[ready] = (handle, time.monotonic() + self._ready_timeout_s)
            self.wanted -= 1
            self._budget -= 1
            stats.replacements_started += 1
            if on_replacement is not None:
                on_replacement(handle)

    def settle_warming(self, ref: Any, stats: DispatchStats) -> None:
        handle, _ = self.warming.pop(ref)
        try:
            ray.get(ref)
        except Exception as exc:  # a replacement that cannot start leaves the pool smaller, never aborts the run
            logger.warning("A replacement actor failed to start: %s", exc)
            return
        self.add(handle)
        stats.replacements_ready += 1

    def expire_warming(self, now: float) -> None:
        for ref, (handle, deadline) in list(self.warming.items()):
            if deadline <= now:
                logger.warning(
                    "A replacement actor was not ready within %.0f s; giving up on it", self._ready_timeout_s
                )
                del self.warming[ref]
                ray.kill(handle)


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
    attempt_timeout_s: float | Callable[[], float | None] | None = None,
    replacements: Replacements | None = None,
    max_replacements: int | None = None,
    ready_timeout_s: float = 600.0,
    room_wait_s: float = 10.0,
    poll_timeout_s: float = 1.0,
    on_replacement: Callable[[Any], None] | None = None,
) -> DispatchStats:
    """Run every item on the actor pool, pulling items lazily so memory stays bounded.

    ``submit(actor, item)`` returns an ObjectRef; ``on_result(item, value)`` gets each success once;
    ``on_failure(item, error)`` gets job errors, items that exhausted ``max_attempts`` because their actors
    kept dying or hanging (``attempt_timeout_s`` per running call, or a function giving it at each submission),
    and, when every actor is gone and none can be replaced within ``room_wait_s``, every item left.
    ``on_replacement(handle)`` hears of each replacement started, so the caller can stop it at the end.
    """
    state: DispatchState[Item] = DispatchState(max_in_flight_per_actor, max_attempts)
    budget = max_replacements if max_replacements is not None else max(4, 2 * len(actors))
    pool = _Pool(actors, state, replacements, budget, ready_timeout_s)
    stats = DispatchStats()
    source = iter(items)
    exhausted = False
    stranded_since: float | None = None
    while True:
        pool.start_wanted(stats, on_replacement)
        while (actor_key := state.pick_actor()) is not None:
            candidate = state.retry.popleft() if state.retry else (None if exhausted else next(source, None))
            if candidate is None:
                exhausted = True
                break
            timeout_s = attempt_timeout_s() if callable(attempt_timeout_s) else attempt_timeout_s
            ref = submit(pool.actors[actor_key], candidate)
            state.submitted(ref, actor_key, candidate, key(candidate), time.monotonic(), timeout_s or None)
            stats.submitted += 1
        if not state.in_flight and exhausted and not state.retry:
            return stats  # replacements still warming are the caller's to stop (on_replacement)
        if not state.in_flight and not pool.warming:
            if not pool.actors:
                stranded_since = stranded_since or time.monotonic()
                if pool.wanted and time.monotonic() - stranded_since < room_wait_s:
                    time.sleep(min(poll_timeout_s, 0.2))  # waiting for room to start a replacement
                    continue
                _fail_the_rest(state, source, on_failure, stats)
                return stats
            continue
        stranded_since = None
        now = time.monotonic()
        timeout = max(0.0, min(poll_timeout_s, state.next_deadline() - now))
        ready, _ = ray.wait([*state.in_flight, *pool.warming], num_returns=1, timeout=timeout)
        for ref in ready:
            if ref in pool.warming:
                pool.settle_warming(ref, stats)
            else:
                _settle(ref, state, pool, stats, on_result, on_failure)
        now = time.monotonic()
        for actor_key in state.overdue(now):
            stats.deadlines_missed += 1
            logger.warning("The call running on actor %d passed its deadline; killing the actor", actor_key)
            _lose(
                actor_key,
                "deadline passed: killed",
                state,
                pool,
                stats,
                on_failure,
                TimeoutError("no result before the attempt's deadline"),
                kill=True,
            )
        pool.expire_warming(now)


def _lose(
    actor_key: int,
    reason: str,
    state: DispatchState[Item],
    pool: _Pool,
    stats: DispatchStats,
    on_failure: Callable[[Item, BaseException], None],
    error: BaseException,
    kill: bool = False,
) -> None:
    """An actor is gone (or hung): every call it held goes back to the queue (or fails, out of attempts)."""
    if pool.lose(actor_key, reason, kill=kill):
        stats.actors_lost += 1
    for attempt in state.drop_actor(actor_key):
        _requeue(attempt, state, stats, on_failure, error)


def _settle(
    ref: Any,
    state: DispatchState[Item],
    pool: _Pool,
    stats: DispatchStats,
    on_result: Callable[[Item, Any], None],
    on_failure: Callable[[Item, BaseException], None],
) -> None:
    """Route one finished call: a result, a lost actor (its calls run elsewhere) or a job error (report)."""
    if ref not in state.in_flight:  # a call of an actor already given up on
        return
    try:
        value = ray.get(ref)
    except LOST as exc:
        _lose(state.in_flight[ref].actor_key, type(exc).__name__, state, pool, stats, on_failure, exc)
        return
    except RayTaskError as exc:
        attempt = state.settled(ref, time.monotonic())
        stats.failed += 1
        on_failure(attempt.item, exc.cause if exc.cause is not None else exc)
        return
    attempt = state.settled(ref, time.monotonic())
    stats.completed += 1
    on_result(attempt.item, value)


def _requeue(
    attempt: Attempt[Item],
    state: DispatchState[Item],
    stats: DispatchStats,
    on_failure: Callable[[Item, BaseException], None],
    error: BaseException,
) -> None:
    if state.can_retry(attempt.item_key):
        state.retry.append(attempt.item)
        stats.retried += 1
    else:
        stats.failed += 1
        on_failure(attempt.item, error)


def _fail_the_rest(
    state: DispatchState[Item],
    source: Iterator[Item],
    on_failure: Callable[[Item, BaseException], None],
    stats: DispatchStats,
) -> None:
    """Every actor is gone and none could be replaced: report every item left (the run stays resumable)."""
    error = BatchError("every worker actor was lost and none could be replaced; rerun to resume")
    left = [*state.retry, *source]
    state.retry.clear()
    logger.error("Every worker actor was lost; %d item(s) could not run", len(left))
    for item in left:
        stats.failed += 1
        on_failure(item, error)
