"""The dispatcher on a real local Ray with small test actors: lost actors, deadlines, attempts, replacements.

Integration tier. The actors here are plain test classes (the product's worker actors run the same protocol:
``run(item)`` and ``ready()``), so each fault is produced for real: an actor process killed, a call that
hangs, a call that raises. Nothing is mocked; only the work is trivial.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_actors import kill_and_wait  # noqa: E402

from distributed_onnx.errors import BatchError  # noqa: E402
from distributed_onnx.runtime.dispatch import (  # noqa: E402
    DispatchCallbacks,
    DispatchConfig,
    Dispatcher,
    DispatchStats,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]


# This module is not importable in Ray's worker processes: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Echo:
    """Doubles an item; items in ``hang`` never return, items in ``bad`` raise (a job error, not a lost actor)."""

    def __init__(self, hang: frozenset[int] = frozenset(), bad: frozenset[int] = frozenset()) -> None:
        self.hang, self.bad = hang, bad

    def ready(self) -> int:
        return 1

    def run(self, item: int) -> int:
        if item in self.hang:
            time.sleep(3600)
        if item in self.bad:
            raise ValueError(f"item {item} is bad")
        time.sleep(0.01)
        return 2 * item


RemoteEcho = ray.remote(num_cpus=0.1, max_restarts=0)(Echo)


class Recorder:
    def __init__(self) -> None:
        self.results: Counter[int] = Counter()
        self.values: dict[int, int] = {}
        self.failures: dict[int, BaseException] = {}
        self.kill_after: tuple[int, list[Any]] | None = None

    def on_result(self, item: int, value: int) -> None:
        self.results[item] += 1
        self.values[item] = value
        if self.kill_after is not None and sum(self.results.values()) == self.kill_after[0]:
            for victim in self.kill_after[1]:
                kill_and_wait(victim)

    def on_failure(self, item: int, error: BaseException) -> None:
        self.failures[item] = error


class EchoReplacements:
    def __init__(self, room: bool = True, hang: frozenset[int] = frozenset()) -> None:
        self.room = room
        self.hang = hang
        self.started: list[Any] = []

    def has_room(self) -> bool:
        return self.room

    def start(self) -> tuple[Any, Any]:
        actor = RemoteEcho.remote(self.hang)
        self.started.append(actor)
        return actor, actor.ready.remote()


def start_pool(hang: frozenset[int] = frozenset(), bad: frozenset[int] = frozenset()) -> list[Any]:
    actors = [RemoteEcho.remote(hang, bad), RemoteEcho.remote(hang, bad)]
    ray.get([actor.ready.remote() for actor in actors])
    STARTED.extend(actors)
    return actors


STARTED: list[Any] = []


@pytest.fixture(autouse=True)
def _kill_started() -> Iterator[None]:
    yield
    for actor in STARTED:
        ray.kill(actor, no_restart=True)
    STARTED.clear()


def run(
    items: list[int],
    actors: list[Any],
    recorder: Recorder,
    *,
    replacements: EchoReplacements | None = None,
    on_replacement: Callable[[Any], None] | None = None,
    attempt_timeout_s: float | None = None,
    **config: Any,
) -> DispatchStats:
    callbacks = DispatchCallbacks[int](
        submit=lambda actor, item: actor.run.remote(item),
        on_result=recorder.on_result,
        on_failure=recorder.on_failure,
        key=lambda item: item,
        attempt_timeout_s=lambda item: attempt_timeout_s,
        on_replacement=on_replacement,
    )
    dispatcher = Dispatcher(actors, callbacks, DispatchConfig(poll_timeout_s=0.2, **config), replacements=replacements)
    return dispatcher.run(items)


def test_every_item_once_on_a_healthy_pool() -> None:
    pool = start_pool()
    recorder = Recorder()
    stats = run(list(range(20)), pool, recorder)
    assert recorder.results == dict.fromkeys(range(20), 1)
    assert recorder.values == {i: 2 * i for i in range(20)}
    assert (stats.submitted, stats.completed, stats.failed, stats.retried) == (20, 20, 0, 0)


def test_a_lost_actor_is_replaced_in_the_background_and_nothing_is_lost_or_doubled() -> None:
    pool = start_pool()
    recorder = Recorder()
    recorder.kill_after = (3, [pool[0]])
    replacements = EchoReplacements()
    spawned: list[Any] = []

    stats = run(list(range(30)), pool, recorder, replacements=replacements, on_replacement=spawned.append)

    assert recorder.results == dict.fromkeys(range(30), 1)
    assert recorder.failures == {}
    assert stats.actors_lost == 1
    assert stats.replacements_started == 1 == len(spawned) == len(replacements.started)
    assert stats.submitted == 30 + stats.retried
    STARTED.extend(spawned)


def test_a_hung_attempt_is_killed_at_its_deadline_and_retried_elsewhere() -> None:
    """Item 5 hangs wherever it runs: each attempt is cut at its deadline, then the item is reported failed."""
    pool = start_pool(hang=frozenset({5}))
    recorder = Recorder()
    replacements = EchoReplacements(hang=frozenset({5}))

    stats = run(list(range(10)), pool, recorder, attempt_timeout_s=1.5, max_attempts=2, replacements=replacements)

    assert recorder.results == {i: 1 for i in range(10) if i != 5}
    assert list(recorder.failures) == [5]
    assert isinstance(recorder.failures[5], TimeoutError)
    assert stats.deadlines_missed == 2  # one per attempt
    assert stats.actors_lost == 2  # each hung actor was killed
    assert stats.replacements_started == 2
    STARTED.extend(replacements.started)


def test_a_job_error_fails_its_item_once_without_retry() -> None:
    pool = start_pool(bad=frozenset({3}))
    recorder = Recorder()
    stats = run(list(range(6)), pool, recorder)
    assert list(recorder.failures) == [3]
    assert isinstance(recorder.failures[3], ValueError)
    assert "item 3 is bad" in str(recorder.failures[3])
    assert stats.retried == 0 and stats.failed == 1 and stats.completed == 5


def test_items_run_out_of_attempts_when_their_actors_keep_dying() -> None:
    """Without replacements, each hung attempt kills its actor: two attempts use up the pool of two."""
    pool = start_pool(hang=frozenset({0}))
    recorder = Recorder()
    stats = run([0], pool, recorder, max_attempts=2, attempt_timeout_s=1.0)
    assert list(recorder.failures) == [0]
    assert stats.deadlines_missed == 2 and stats.failed == 1


def test_when_every_actor_is_lost_every_item_left_is_reported_not_raised() -> None:
    pool = start_pool()
    recorder = Recorder()
    recorder.kill_after = (2, list(pool))

    stats = run(list(range(40)), pool, recorder, room_wait_s=0.5)

    delivered = set(recorder.results)
    assert max(recorder.results.values()) == 1  # nothing delivered twice, even on the way down
    assert delivered | set(recorder.failures) == set(range(40))
    assert not delivered & set(recorder.failures)
    assert all(isinstance(error, BatchError) for error in recorder.failures.values())
    assert "every worker actor was lost" in str(next(iter(recorder.failures.values())))
    assert stats.actors_lost == 2


def test_no_room_for_a_replacement_shrinks_the_pool_without_stalling() -> None:
    pool = start_pool()
    recorder = Recorder()
    recorder.kill_after = (2, [pool[0]])
    replacements = EchoReplacements(room=False)

    stats = run(list(range(20)), pool, recorder, replacements=replacements)

    assert recorder.results == dict.fromkeys(range(20), 1)
    assert stats.replacements_started == 0
    assert replacements.started == []


class Unreachable(Echo):
    """Answers one item with Ray's ActorUnavailableError (as Ray does for an actor it cannot reach) and lives on."""

    def run(self, item: int) -> int:
        if item == 2:
            raise ray.exceptions.ActorUnavailableError("injected: the actor is temporarily unreachable", None)
        return super().run(item)


def test_an_unavailable_actor_is_killed_not_left_running_its_queue() -> None:
    """Before, the actor was dropped but not killed: its queued parts kept running while they ran again elsewhere."""
    unreachable = ray.remote(num_cpus=0.1, max_restarts=0)(Unreachable).remote()
    healthy = RemoteEcho.remote()
    ray.get([unreachable.ready.remote(), healthy.ready.remote()])
    STARTED.extend([unreachable, healthy])
    recorder = Recorder()

    stats = run(list(range(8)), [unreachable, healthy], recorder)

    assert recorder.results == dict.fromkeys(range(8), 1)
    assert stats.actors_lost == 1
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(unreachable.ready.remote(), timeout=60)
    assert ray.get(healthy.ready.remote(), timeout=60) == 1
