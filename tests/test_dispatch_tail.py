"""The dispatcher's tail, on the fleet benchmark's simulated cluster (its real loop and bookkeeping, a fake clock)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fleet_sim import Fleet, simulate

from distributed_onnx.evaluation.data.windows import WindowPlan
from distributed_onnx.evaluation.planning._part_count import default_ramp_width, default_windows_per_part, plan_parts
from distributed_onnx.runtime.dispatch_tail import TailPolicy

WINDOWS = 200_000


def _run(fleet: Fleet, hold_the_tail: bool = True) -> dict[str, object]:
    plan = WindowPlan(np.array([WINDOWS]), np.array([0, WINDOWS]), skipped=0, capped=0, capped_series=())
    width = default_ramp_width(fleet.actors)
    parts = plan_parts(plan, default_windows_per_part(WINDOWS, 256, fleet.actors), 256, width)
    return simulate(fleet, parts, WINDOWS, first_wave=width, hold_the_tail=hold_the_tail)


FLEET = Fleet(actors=40, nodes=4, windows_per_s=100.0, stragglers=0.1, lose_node_at=None, seed=3)


def test_slow_actors_do_not_hold_the_end_of_the_run() -> None:
    held = _run(FLEET)
    free = _run(FLEET, hold_the_tail=False)
    assert held["completed"] == free["completed"] and held["failed"] == 0
    assert float(held["over_ideal"]) < 0.15  # type: ignore[arg-type]
    assert float(held["over_ideal"]) < float(free["over_ideal"]) / 2  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore")
def test_a_lost_node_loses_no_part() -> None:
    result = _run(replace(FLEET, lose_node_at=0.5, node_back_after_s=5.0))
    assert result["actors_lost"] == 10 and result["replacements_ready"] == 10
    assert result["failed"] == 0 and int(result["parts_retried"]) > 0  # type: ignore[call-overload]
    assert result["completed"] == result["parts"]


def test_an_actor_gets_an_item_only_if_it_finishes_it_before_the_pool_runs_dry() -> None:
    policy = TailPolicy(left=1000.0)
    policy.set_rates([10.0] * 9 + [1.0], unmeasured=0)  # pool: 91 items/s, 1000 left: ~11 s
    assert policy.give(100.0, 10.0, load=0, busy_for_s=0.0)  # 10 s: in time
    assert not policy.give(100.0, 10.0, load=1, busy_for_s=5.0)  # 15 s queued behind a call: another takes it
    assert not policy.give(100.0, 1.0, load=0, busy_for_s=0.0)  # 100 s on a slow actor: it waits for another
    assert policy.give(100.0, 6.0, load=0, busy_for_s=0.0)  # late, but an idle ordinary actor: serialising is worse
    assert policy.give(100.0, None, load=0, busy_for_s=None) and not policy.give(100.0, None, 1, None)


def test_an_idle_driver_waits_for_results_not_for_a_poll_every_second() -> None:
    # 2 actors of 10 windows/s over 200,000 windows: parts of minutes, a run of hours on the fake clock. The loop
    # wakes for results (and the ramp's passed-over actors), not once a second: each wake is the driver's CPU.
    result = _run(Fleet(actors=2, nodes=1, windows_per_s=10.0, stragglers=0.0, lose_node_at=None, seed=1))
    assert result["completed"] == result["parts"] and result["failed"] == 0
    assert int(result["waits"]) < 4 * int(result["parts"]) + float(result["finished_s"]) / 5  # type: ignore[call-overload,arg-type]
