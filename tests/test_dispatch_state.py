"""Unit tier: the dispatcher's bookkeeping (pure code; Ray is imported by the module but never started)."""

from __future__ import annotations

from distributed_onnx.dispatch import DispatchState


def _state(actors: int = 3, per_actor: int = 2, max_attempts: int = 3) -> DispatchState[str]:
    state: DispatchState[str] = DispatchState(max_in_flight_per_actor=per_actor, max_attempts=max_attempts)
    for key in range(actors):
        state.add_actor(key)
    return state


def test_picks_the_least_loaded_actor_lowest_key_on_ties() -> None:
    state = _state()
    assert state.pick_actor() == 0
    state.submitted("ref-a", 0, "a", 0)
    assert state.pick_actor() == 1
    state.submitted("ref-b", 1, "b", 1)
    assert state.pick_actor() == 2
    state.submitted("ref-c", 2, "c", 2)
    assert state.pick_actor() == 0
    state.settled("ref-b")
    assert state.pick_actor() == 1


def test_submissions_spread_evenly() -> None:
    state = _state(actors=3, per_actor=4)
    for i in range(9):
        actor = state.pick_actor()
        assert actor is not None
        state.submitted(f"ref-{i}", actor, f"item-{i}", i)
    assert state.load == {0: 3, 1: 3, 2: 3}


def test_in_flight_is_bounded_per_actor() -> None:
    state = _state(actors=2, per_actor=2)
    for i in range(4):
        actor = state.pick_actor()
        assert actor is not None
        state.submitted(f"ref-{i}", actor, f"item-{i}", i)
    assert state.pick_actor() is None
    assert len(state.in_flight) == 4
    assert state.load == {0: 2, 1: 2}
    actor, item = state.settled("ref-3")
    assert (actor, item) == (1, "item-3")
    assert state.pick_actor() == 1
    assert "ref-3" not in state.in_flight


def test_no_actor_no_pick() -> None:
    assert _state(actors=0).pick_actor() is None


def test_retry_queue_is_first_in_first_out() -> None:
    state = _state()
    state.retry.append("a")
    state.retry.append("b")
    assert state.retry.popleft() == "a"
    assert list(state.retry) == ["b"]


def test_attempts_limit() -> None:
    state = _state(actors=1, per_actor=1, max_attempts=2)
    assert state.can_retry(7)
    state.submitted("ref-1", 0, "x", 7)
    state.settled("ref-1")
    assert state.can_retry(7)
    state.submitted("ref-2", 0, "x", 7)
    state.settled("ref-2")
    assert not state.can_retry(7)
    assert state.attempts == {7: 2}
    assert state.can_retry(8)  # counted per item


def test_removed_actor_is_never_picked_and_its_settlements_do_not_revive_it() -> None:
    state = _state(actors=2, per_actor=2)
    state.submitted("ref-a", 0, "a", 0)
    state.submitted("ref-b", 0, "b", 1)
    state.remove_actor(0)
    assert 0 not in state.load
    assert state.pick_actor() == 1
    actor, item = state.settled("ref-a")
    assert (actor, item) == (0, "a")
    assert 0 not in state.load
    assert state.pick_actor() == 1
    state.remove_actor(0)  # removing twice is harmless


def test_removing_every_actor_leaves_nothing_to_pick() -> None:
    state = _state(actors=2)
    state.remove_actor(0)
    state.remove_actor(1)
    assert state.pick_actor() is None


def test_added_actor_starts_empty_and_is_picked_first() -> None:
    state = _state(actors=1, per_actor=3)
    state.submitted("ref-a", 0, "a", 0)
    state.add_actor(5)
    assert state.load[5] == 0
    assert state.pick_actor() == 5
