"""Unit tier: the dispatcher's bookkeeping (pure code; Ray is imported by the module but never started)."""

from __future__ import annotations

from distributed_onnx.runtime.dispatch import DispatchState


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
    attempt = state.settled("ref-3")
    assert (attempt.actor_key, attempt.item) == (1, "item-3")
    assert state.pick_actor() == 1
    assert "ref-3" not in state.in_flight


def test_no_actor_no_pick() -> None:
    assert _state(actors=0).pick_actor() is None


def test_a_deadline_runs_from_when_a_call_reaches_the_head_of_its_actor() -> None:
    state = _state(actors=2, per_actor=2)
    state.submitted("ref-a", 0, "a", 0, now=0.0, timeout_s=10.0)
    state.submitted("ref-b", 0, "b", 1, now=1.0, timeout_s=10.0)  # queued behind a on actor 0
    state.submitted("ref-c", 1, "c", 2, now=2.0)  # no deadline
    assert state.next_deadline() == 10.0
    assert state.overdue(now=9.9) == []
    assert state.overdue(now=10.0) == [0]
    state.settled("ref-a", now=8.0)  # b starts running at 8, not at its submission (1)
    assert state.next_deadline() == 18.0
    assert state.overdue(now=17.0) == []
    state.settled("ref-b", now=9.0)
    assert state.next_deadline() == float("inf")
    assert state.overdue(now=1e12) == []


def test_a_lost_actor_charges_only_its_running_call() -> None:
    state = _state(actors=2, per_actor=3)
    for i, ref in enumerate(["ref-a", "ref-b", "ref-c"]):
        state.submitted(ref, 0, ref[-1], i, now=float(i), timeout_s=5.0)
    state.submitted("ref-d", 1, "d", 3)
    dropped = state.drop_actor(0)
    assert [attempt.item for attempt in dropped] == ["a", "b", "c"]
    assert state.attempts == {0: 1, 1: 0, 2: 0, 3: 1}  # b and c never ran: their attempts are given back
    assert list(state.in_flight) == ["ref-d"]
    assert 0 not in state.load
    assert state.overdue(now=1e12) == []


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
    attempt = state.settled("ref-a")
    assert (attempt.actor_key, attempt.item) == (0, "a")
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
