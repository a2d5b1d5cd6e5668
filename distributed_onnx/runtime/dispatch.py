"""Fan-out of small work descriptors over worker actors: bounded in flight, deadlines, lost work re-run.

The bookkeeping (:class:`~distributed_onnx.runtime.dispatch_state.DispatchState`) is plain code with no Ray in
it; a :class:`Dispatcher` is the loop that submits, waits and routes outcomes. It is built once from what it
may do (:class:`DispatchConfig`, frozen values) and what it calls (:class:`DispatchCallbacks`), and
``run(items)`` returns the counters of that run. Each item has at most one attempt in flight and its result is
delivered once. When an actor (or its node) dies, or an attempt outlives its deadline (the actor is then
killed: a hung call is a lost call), the item goes back to the queue and runs elsewhere, at most
``max_attempts`` times; an item that *fails* (the job raised) is reported and not retried. A lost actor's
replacement starts in the background: the loop keeps feeding the other actors while it warms up, and adds it
once it is ready.

Near the end a call is queued behind a running one only while at least as many items are left as there are
actors: the last items go to whichever actor frees up first, not into the queue of a slow one (the run would
wait for it). The loop talks to Ray and the clock only through a :class:`~.dispatch_runtime.DispatchRuntime`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol

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
from distributed_onnx.runtime.dispatch_runtime import DispatchRuntime, RayRuntime
from distributed_onnx.runtime.dispatch_state import Attempt, DispatchState, DispatchStats, Item
from distributed_onnx.runtime.dispatch_tail import TailPolicy

__all__ = ["LOST", "DispatchCallbacks", "DispatchConfig", "DispatchStats", "Dispatcher", "Replacements"]

logger = logging.getLogger(__name__)

#: Busy actors one fill may pass over (each would finish the next item too late) before it waits: the few slow
#: ones are passed, and a fill never scans the whole pool.
PASS_AT_MOST = 8

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


def _no_deadline(item: Any) -> float | None:
    return None


@dataclass(frozen=True)
class DispatchConfig:
    """How a dispatcher may use its pool (values only: what it calls is in :class:`DispatchCallbacks`)."""

    #: Calls queued on one actor; two or more hide Ray's per-call cost behind the running one.
    max_in_flight_per_actor: int = 2
    #: Attempts per item when its actors keep dying or hanging (a job error is never retried).
    max_attempts: int = 3
    #: Replacement actors one run may start; None: ``max(4, 2 * pool size)``.
    max_replacements: int | None = None
    #: How long a replacement may take to become ready before it is given up (and killed).
    ready_timeout_s: float = 600.0
    #: How long a run with no actor left waits for room to start a replacement before failing the rest.
    room_wait_s: float = 10.0
    #: How often the loop looks again while something it waits for cannot wake it: replacements waiting for room
    #: in the cluster, or an actor passed over in the tail (it may become fast enough to take an item as its
    #: running call ages).
    poll_timeout_s: float = 1.0
    #: The longest single wait on Ray otherwise: a result, a lost actor, a replacement's readiness wake the loop,
    #: and a wait ends at the next deadline or replacement's ready timeout, so an idle driver does not wake every
    #: ``poll_timeout_s`` (each wake costs its CPU, over the whole run's wall time, not per part).
    idle_wait_s: float = 10.0
    #: Keep the run's last items off actors that would finish them last (:mod:`.dispatch_tail`; a source of known
    #: length): with the callbacks' ``size``, by the actors' measured speeds, else by counting the items left.
    hold_the_tail: bool = True
    #: An actor slower than this share of the median gets no item that would outlast the run.
    tail_slow_share: float = 0.5
    #: While every actor has a call queued behind its running one, a wait that found a result goes on this long
    #: (at most a tenth of a part) to collect others: one of Ray's waits per batch of results, not per result.
    linger_s: float = 0.25


@dataclass(frozen=True)
class DispatchCallbacks(Generic[Item]):
    """What a dispatcher calls: how to submit an item and name it, where outcomes go, each attempt's deadline."""

    #: ``submit(actor, item)`` starts the call and returns its ObjectRef.
    submit: Callable[[Any, Item], Any]
    #: ``on_result(item, value)``: each success, exactly once.
    on_result: Callable[[Item, Any], None]
    #: ``on_failure(item, error)``: job errors, items out of attempts, and every item left when no actor is.
    on_failure: Callable[[Item, BaseException], None]
    #: A stable integer per item (attempts are counted per key).
    key: Callable[[Item], int]
    #: The deadline of the call about to be submitted, given its item (asked at each submission, so it may follow
    #: the item's size and what was observed so far; None: no deadline).
    attempt_timeout_s: Callable[[Item], float | None] = _no_deadline
    #: Hears of each replacement actor started, so the caller can stop it at the end.
    on_replacement: Callable[[Any], None] | None = None
    #: The work in an item (a part's windows): each actor's speed is measured with it (None: not measured).
    size: Callable[[Item], float] | None = None


class _Pool:
    """Live actors by key, actors being replaced, and replacements warming up."""

    def __init__(
        self,
        actors: list[Any],
        state: DispatchState[Any],
        replacements: Replacements | None,
        runtime: DispatchRuntime,
        *,
        budget: int,
        ready_timeout_s: float,
    ) -> None:
        self.actors: dict[int, Any] = {}
        self.warming: dict[Any, tuple[Any, float]] = {}  # ready ref -> (handle, deadline)
        self.wanted = 0
        self._state = state
        self._replacements = replacements
        self._runtime = runtime
        self._budget = budget
        self._ready_timeout_s = ready_timeout_s
        self._next_key = 0
        for actor in actors:
            self.add(actor)

    def add(self, actor: Any) -> None:
        self.actors[self._next_key] = actor
        self._state.add_actor(self._next_key)
        self._next_key += 1

    def lose(self, actor_key: int, reason: str, *, kill: bool = False) -> bool:
        """Drop a dead (or hung: ``kill``) actor once and ask for a replacement; True if it was in the pool."""
        actor = self.actors.pop(actor_key, None)
        if actor is None:
            return False
        logger.warning("Worker actor %d lost (%s); its work runs again elsewhere", actor_key, reason)
        self._state.remove_actor(actor_key)
        if kill:
            try:
                self._runtime.kill(actor)
            except Exception as exc:  # already gone with its node: nothing is left to stop
                logger.debug("Could not kill lost actor %d: %s", actor_key, exc)
        if self._replacements is not None and self._budget > 0:
            self.wanted += 1
        return True

    def start_wanted(self) -> list[Any]:
        """Start the replacements asked for, as far as the cluster has room now (never waits); their handles."""
        started = []
        while self.wanted and self._budget > 0 and self._replacements is not None and self._replacements.has_room():
            handle, ready = self._replacements.start()
            self.warming[ready] = (handle, self._runtime.now() + self._ready_timeout_s)
            self.wanted -= 1
            self._budget -= 1
            started.append(handle)
        return started

    def settle_warming(self, ref: Any) -> bool:
        """Add a replacement whose readiness resolved; False if it failed to start."""
        handle, _ = self.warming.pop(ref)
        try:
            self._runtime.get(ref)
        except Exception as exc:  # a replacement that cannot start leaves the pool smaller, never aborts the run
            logger.warning("A replacement actor failed to start: %s", exc)
            return False
        self.add(handle)
        return True

    def next_expiry(self) -> float:
        """The earliest ready timeout of the replacements warming up (inf: none is)."""
        return min((deadline for _, deadline in self.warming.values()), default=float("inf"))

    def expire_warming(self, now: float) -> None:
        for ref, (handle, deadline) in list(self.warming.items()):
            if deadline <= now:
                logger.warning(
                    "A replacement actor was not ready within %.0f s; giving up on it", self._ready_timeout_s
                )
                del self.warming[ref]
                self._runtime.kill(handle)


class Dispatcher(Generic[Item]):
    """Runs items on a pool of actors, pulling them lazily so memory stays bounded.

    Each :meth:`run` starts with fresh bookkeeping from the actors given here and returns its own counters;
    actors lost or started during a run are not carried into the next, so build one dispatcher per pool and run.

    Any actor will do: the callbacks say how an item becomes a call (on a running local Ray, as the tests' on
    127.0.0.1; ``num_cpus=0`` only so that the example reserves no core):

    >>> import ray
    >>> @ray.remote(num_cpus=0)
    ... class Squarer:
    ...     def run(self, item):
    ...         return item * item
    >>> actors = [Squarer.remote(), Squarer.remote()]
    >>> squares = {}
    >>> callbacks = DispatchCallbacks(
    ...     submit=lambda actor, item: actor.run.remote(item),
    ...     on_result=squares.__setitem__,
    ...     on_failure=lambda item, error: print(f"{item} failed: {error}"),
    ...     key=lambda item: item,
    ... )
    >>> stats = Dispatcher(actors, callbacks).run(range(6))
    >>> sorted(squares.items())
    [(0, 0), (1, 1), (2, 4), (3, 9), (4, 16), (5, 25)]
    >>> stats.submitted, stats.completed, stats.failed
    (6, 6, 0)
    >>> for actor in actors:
    ...     ray.kill(actor)
    """

    def __init__(
        self,
        actors: list[Any],
        callbacks: DispatchCallbacks[Item],
        config: DispatchConfig | None = None,
        *,
        replacements: Replacements | None = None,
        runtime: DispatchRuntime | None = None,
    ) -> None:
        self._actors = list(actors)
        self._calls = callbacks
        self._config = config if config is not None else DispatchConfig()
        self._replacements = replacements
        self._runtime = runtime if runtime is not None else RayRuntime()

    def run(self, items: Iterable[Item]) -> DispatchStats:
        """Run every item once (or report it through ``on_failure``); returns what happened, counted.

        An item whose call raises is the job's failure: reported once, with the call's own exception, and not
        retried (it would fail the same way); the other items run on:

        >>> import ray
        >>> @ray.remote(num_cpus=0)
        ... class NoTwos:
        ...     def run(self, item):
        ...         if item == 2:
        ...             raise ValueError("no twos")
        ...         return item
        >>> actor = NoTwos.remote()
        >>> done, failed = [], []
        >>> callbacks = DispatchCallbacks(
        ...     submit=lambda actor, item: actor.run.remote(item),
        ...     on_result=lambda item, value: done.append(value),
        ...     on_failure=lambda item, error: failed.append((item, repr(error))),
        ...     key=lambda item: item,
        ... )
        >>> stats = Dispatcher([actor], callbacks).run([1, 2, 3])
        >>> sorted(done), failed, (stats.completed, stats.failed, stats.retried)
        ([1, 3], [(2, "ValueError('no twos')")], (2, 1, 0))
        >>> ray.kill(actor)
        """
        left = len(items) if isinstance(items, Sized) else None
        size = self._calls.size
        work = None
        if left is not None and size is not None and self._config.hold_the_tail:
            work = float(sum(size(item) for item in items))
        return _Run(self, iter(items), left, work).loop()


class _Run(Generic[Item]):
    """The state of one :meth:`Dispatcher.run`: bookkeeping, the pool, the source and the counters."""

    def __init__(
        self, dispatcher: Dispatcher[Item], source: Iterator[Item], left: int | None = None, work: float | None = None
    ) -> None:
        config = dispatcher._config
        self.calls = dispatcher._calls
        self.config = config
        self.runtime = dispatcher._runtime
        self.left = left  # items not yet taken from the source, when its length is known
        self.tail = None if work is None else TailPolicy(work, config.tail_slow_share)
        self.peeked: Item | None = None  # the source's next item, taken out to decide where it goes
        self.state: DispatchState[Item] = DispatchState(config.max_in_flight_per_actor, config.max_attempts)
        budget = config.max_replacements
        if budget is None:
            budget = max(4, 2 * len(dispatcher._actors))
        self.pool = _Pool(
            dispatcher._actors,
            self.state,
            dispatcher._replacements,
            self.runtime,
            budget=budget,
            ready_timeout_s=config.ready_timeout_s,
        )
        self.stats = DispatchStats()
        self.source = source
        self.exhausted = False
        self.passed_over = False  # the last fill passed a busy actor over (see DispatchConfig.poll_timeout_s)

    def loop(self) -> DispatchStats:
        state, pool, config, runtime = self.state, self.pool, self.config, self.runtime
        stranded_since: float | None = None
        while True:
            self._start_replacements()
            self._fill()
            if not state.in_flight and self.exhausted and not state.retry:
                break  # replacements still warming are the caller's to stop (on_replacement)
            if not state.in_flight and not pool.warming:
                if not pool.actors:
                    stranded_since = stranded_since or runtime.now()
                    if pool.wanted and runtime.now() - stranded_since < config.room_wait_s:
                        runtime.sleep(min(config.poll_timeout_s, 0.2))  # waiting for room to start a replacement
                        continue
                    self._fail_the_rest()
                    break
                continue
            stranded_since = None
            self._wait_and_settle()
            now = runtime.now()
            for actor_key in state.overdue(now):
                self.stats.deadlines_missed += 1
                logger.warning("The call running on actor %d passed its deadline; killing the actor", actor_key)
                error = TimeoutError("no result before the attempt's deadline")
                self._lose(actor_key, "deadline passed: killed", error, kill=True)
            pool.expire_warming(now)
        return replace(self.stats)  # a copy: the counters of a finished run do not change

    def _start_replacements(self) -> None:
        for handle in self.pool.start_wanted():
            self.stats.replacements_started += 1
            if self.calls.on_replacement is not None:
                self.calls.on_replacement(handle)

    def _fill(self) -> None:
        """Submit items (retries first) while some actor has room."""
        passed: list[int] = []  # busy actors that would finish the next item too late: asked again next time
        try:
            self._fill_passing(passed)
        finally:
            self.passed_over = bool(passed)
            self.state.unbench(passed)

    def _fill_passing(self, passed: list[int]) -> None:
        state = self.state
        while True:
            actor_key = state.pick_actor()
            if actor_key is None:
                if state.in_flight or not state.benched:
                    return
                state.unbench_all()  # nothing runs: the slow actors are all there is, and they get the rest
                self.tail = None
                continue
            load = state.load[actor_key]
            if self.tail is None and load and not self._plenty_left():
                return  # every actor is busy and the tail is near: the next to free up takes the next item
            candidate = self._next_item()
            if candidate is None:
                self.exhausted = True
                return
            if self.tail is not None and not self._give(actor_key, candidate, load):
                if load and len(passed) >= PASS_AT_MOST:
                    return  # every actor asked is busy: the next to free up takes it
                state.bench(actor_key)  # idle: it would finish it after the others are done; busy: not now
                if load:
                    passed.append(actor_key)
                continue
            self._take(candidate)
            timeout_s = self.calls.attempt_timeout_s(candidate)
            ref = self.calls.submit(self.pool.actors[actor_key], candidate)
            key = self.calls.key(candidate)
            size = None if self.calls.size is None else self.calls.size(candidate)
            now = self.runtime.now()
            state.submitted(ref, actor_key, candidate, key, now=now, timeout_s=timeout_s or None, size=size)
            self.stats.submitted += 1

    def _next_item(self) -> Item | None:
        """The next item to place (retries first), not yet taken: see :meth:`_take`."""
        if self.state.retry:
            return self.state.retry[0]
        if self.peeked is None and not self.exhausted:
            self.peeked = next(self.source, None)
            if self.peeked is not None and self.left is not None:
                self.left -= 1
        return self.peeked

    def _take(self, item: Item) -> None:
        if self.state.retry and self.state.retry[0] is item:
            self.state.retry.popleft()
        else:
            self.peeked = None
        if self.tail is not None and self.calls.size is not None:
            self.tail.took(self.calls.size(item))

    def _give(self, actor_key: int, item: Item, load: int) -> bool:
        tail, state = self.tail, self.state
        assert tail is not None and self.calls.size is not None
        if tail.needs_median(len(state.load)):
            rates = [rate for key in state.load if (rate := state.rate(key)) is not None]
            tail.set_rates(rates, len(state.load) - len(rates))
        busy_for_s = state.time_to_free_s(actor_key, self.runtime.now())
        return tail.give(self.calls.size(item), state.rate(actor_key), load, busy_for_s)

    def _plenty_left(self) -> bool:
        """Whether enough items are left to queue one behind a running call (see ``hold_the_tail``)."""
        if not self.config.hold_the_tail or self.left is None:
            return True
        return self.left + len(self.state.retry) >= len(self.pool.actors)

    def _wait_and_settle(self) -> None:
        state, pool = self.state, self.pool
        timeout = max(0.0, self._wake_at() - self.runtime.now())
        ready = self.runtime.wait([*state.in_flight, *pool.warming], timeout, self._linger_s())
        for ref in ready:
            if ref in pool.warming:
                if pool.settle_warming(ref):
                    self.stats.replacements_ready += 1
            else:
                self._settle(ref)

    def _wake_at(self) -> float:
        """When the loop must look again if nothing it waits on resolves: the next deadline, the next replacement's
        ready timeout, a poll while it waits for something that cannot wake it, else ``idle_wait_s`` from now."""
        config, pool = self.config, self.pool
        polling = self.passed_over or pool.wanted > 0
        wait_s = config.poll_timeout_s if polling else max(config.idle_wait_s, config.poll_timeout_s)
        return min(self.runtime.now() + wait_s, self.state.next_deadline(), pool.next_expiry())

    def _linger_s(self) -> float:
        """How long a wait that found a result may go on collecting others: only while no actor is idle (an
        actor's queued call keeps it busy meanwhile), and at most a tenth of a median part."""
        state, limit = self.state, self.config.linger_s
        if not limit or self.tail is None or self.tail.median_rate is None or not state.in_flight:
            return 0.0
        key = state.pick_actor()
        if key is not None and state.load[key] == 0:
            return 0.0  # an actor waits for work: wake up for it at once
        part = (self.tail.in_flight / len(state.in_flight)) / self.tail.median_rate
        return min(limit, 0.1 * part)

    def _settle(self, ref: Any) -> None:
        """Route one finished call: a result, a lost actor (its calls run elsewhere) or a job error (report)."""
        state = self.state
        if ref not in state.in_flight:  # a call of an actor already given up on
            return
        try:
            value = self.runtime.get(ref)
        except LOST as exc:
            # Killed as well: an actor that is only unreachable (ActorUnavailableError), or whose result was lost,
            # may still be running its queued calls while they run again elsewhere (two writers of one part).
            self._lose(state.in_flight[ref].actor_key, type(exc).__name__, exc, kill=True)
            return
        except RayTaskError as exc:
            attempt = state.settled(ref, self.runtime.now())
            self._tail_finished(attempt.item, ok=False)
            self.stats.failed += 1
            self.calls.on_failure(attempt.item, exc.cause if exc.cause is not None else exc)
            return
        size = None if self.calls.size is None else self.calls.size(state.in_flight[ref].item)
        attempt = state.settled(ref, self.runtime.now(), size)
        if self.tail is not None and size is not None:
            self.tail.finished(size)
        self.stats.completed += 1
        self.calls.on_result(attempt.item, value)

    def _lose(self, actor_key: int, reason: str, error: BaseException, *, kill: bool = False) -> None:
        """An actor is gone (or hung): every call it held goes back to the queue (or fails, out of attempts)."""
        if self.pool.lose(actor_key, reason, kill=kill):
            self.stats.actors_lost += 1
        for attempt in self.state.drop_actor(actor_key):
            self._requeue(attempt, error)

    def _tail_finished(self, item: Item, *, ok: bool) -> None:
        if self.tail is not None and self.calls.size is not None:
            self.tail.finished(self.calls.size(item), ok=ok)

    def _requeue(self, attempt: Attempt[Item], error: BaseException) -> None:
        if self.state.can_retry(attempt.item_key):
            self.state.retry.append(attempt.item)
            if self.tail is not None and self.calls.size is not None:
                self.tail.returned(self.calls.size(attempt.item))
            self.stats.retried += 1
        else:
            self._tail_finished(attempt.item, ok=False)
            self.stats.failed += 1
            self.calls.on_failure(attempt.item, error)

    def _fail_the_rest(self) -> None:
        """Every actor is gone and none could be replaced: report every item left (the run stays resumable)."""
        error = BatchError("every worker actor was lost and none could be replaced; rerun to resume")
        left = [*self.state.retry, *([self.peeked] if self.peeked is not None else []), *self.source]
        self.peeked = None
        self.state.retry.clear()
        logger.error("Every worker actor was lost; %d item(s) could not run", len(left))
        for item in left:
            self.stats.failed += 1
            self.calls.on_failure(item, error)
