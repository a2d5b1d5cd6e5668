"""Unit tier: attempt deadlines that fit the part, on a simulated clock with a slow actor (no Ray started).

The dispatcher's own bookkeeping (:class:`DispatchState`) runs a backtest's ramp of parts (1, 2, 4, ... 62
batches) on four actors that take 3 s a batch (a real Chronos-2 on CPU), two calls in flight as the dispatcher
keeps them. The old rule (1,800 s before any part finished, then max(120 s, 10x the slowest part)) gave the
62-batch part, submitted while only 4-batch parts had finished, 120 s for 186 s of work: a healthy actor
was killed and the part's attempts were used up.
"""

from __future__ import annotations

import pytest

from distributed_onnx.evaluation.driver._deadlines import AttemptDeadlines
from distributed_onnx.runtime.dispatch_state import DispatchState

ROWS_PER_BATCH = 16
SECONDS_PER_BATCH = 3.0


def _ramp(total_batches: int, largest: int = 62) -> list[int]:
    sizes, size, covered = [], 1, 0
    while covered < total_batches:
        take = min(size, largest, total_batches - covered)
        sizes.append(take)
        covered += take
        size *= 2
    return sizes


def _run_slow_actors(
    part_batches: list[int], deadlines: AttemptDeadlines, actors: int = 4
) -> list[tuple[int, float, float]]:
    """Drive ``actors`` slow actors through every part on a simulated clock, as the dispatcher feeds them.

    Each actor runs its calls one after the other (the head runs, the next waits), so a part's running time
    starts when the one before it on its actor finishes. Returns (part, deadline, seconds needed) per part, in
    finishing order; fails if any part would pass its deadline before it finishes.
    """
    state: DispatchState[int] = DispatchState(max_in_flight_per_actor=2)
    for actor in range(actors):
        state.add_actor(actor)
    now, pending, finished = 0.0, list(range(len(part_batches))), []
    given: dict[int, float] = {}
    while pending or state.in_flight:
        while pending and (actor := state.pick_actor()) is not None:
            part = pending.pop(0)
            given[part] = deadlines.deadline_s(part_batches[part] * ROWS_PER_BATCH)
            state.submitted(f"ref-{part}", actor, part, part, now=now, timeout_s=given[part])

        def finishes_at(actor: int) -> float:
            head = state.in_flight[state.queues[actor][0]].item
            return state.head_since[actor] + part_batches[head] * SECONDS_PER_BATCH

        actor = min((a for a, queue in state.queues.items() if queue), key=finishes_at)
        done_at = finishes_at(actor)
        overdue = state.overdue(done_at - 1e-9)
        assert overdue == [], [(state.in_flight[state.queues[a][0]].item, state.head_timeout_s[a]) for a in overdue]
        now = done_at
        head = state.settled(state.queues[actor][0], now).item
        needed = part_batches[head] * SECONDS_PER_BATCH
        deadlines.observe(part_batches[head] * ROWS_PER_BATCH, needed)
        finished.append((head, given[head], needed))
    return finished


def test_a_slow_actor_finishes_the_whole_ramp_without_being_killed() -> None:
    sizes = _ramp(500)
    assert sizes[:7] == [1, 2, 4, 8, 16, 32, 62]
    finished = _run_slow_actors(sizes, AttemptDeadlines(), actors=4)
    assert sorted(part for part, _, _ in finished) == list(range(len(sizes)))
    largest = next(entry for entry in finished if sizes[entry[0]] == 62)
    assert largest[2] == 186.0 and largest[1] >= 10 * 186.0 / 4  # submitted once 4-batch parts had finished


def test_the_largest_part_gets_a_deadline_from_its_size_and_the_rate_seen() -> None:
    deadlines = AttemptDeadlines()
    assert deadlines.deadline_s(62 * ROWS_PER_BATCH) == 1800.0  # nothing finished yet
    deadlines.observe(4 * ROWS_PER_BATCH, 4 * SECONDS_PER_BATCH)  # only a 4-batch part has finished
    assert deadlines.deadline_s(62 * ROWS_PER_BATCH) == pytest.approx(10 * 62 * SECONDS_PER_BATCH)  # 1,860 s
    assert deadlines.deadline_s(1 * ROWS_PER_BATCH) == 120.0  # the floor


def test_the_slowest_rate_counts_not_the_slowest_part() -> None:
    deadlines = AttemptDeadlines(factor=2.0, floor_s=1.0)
    deadlines.observe(100, 10.0)  # 0.1 s a window
    deadlines.observe(1, 1.0)  # 1 s a window: a small part, with its fixed costs
    deadlines.observe(0, 5.0)  # ignored: no windows
    assert deadlines.slowest_s_per_item == 1.0
    assert deadlines.deadline_s(50) == 100.0


def test_a_hung_actor_is_still_caught_by_the_deadline() -> None:
    deadlines = AttemptDeadlines()
    deadlines.observe(64, 12.0)  # 0.1875 s a window
    state: DispatchState[int] = DispatchState(max_in_flight_per_actor=2)
    state.add_actor(0)
    state.submitted("ref", 0, 7, 7, now=100.0, timeout_s=deadlines.deadline_s(992))
    limit = 10 * 0.1875 * 992  # 1,860 s
    assert state.overdue(100.0 + limit - 1) == []
    assert state.overdue(100.0 + limit) == [0]
