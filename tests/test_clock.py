"""The driver's phase clock (unit): each mark charges wall and CPU seconds since the previous one to its phase."""

from __future__ import annotations

import pytest

from distributed_onnx.evaluation.driver import clock as clock_module
from distributed_onnx.evaluation.driver.clock import PhaseClock


class FakeTime:
    """Wall and CPU readings the test advances by hand."""

    def __init__(self) -> None:
        self.wall_s = 100.0
        self.cpu_s = 2.0

    def advance(self, wall_s: float, cpu_s: float) -> None:
        self.wall_s += wall_s
        self.cpu_s += cpu_s


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: fake.wall_s)
    monkeypatch.setattr(clock_module, "driver_cpu_s", lambda: fake.cpu_s)
    return fake


def test_phases_get_what_passed_since_the_previous_mark_and_add_up(fake_time: FakeTime) -> None:
    clock = PhaseClock()
    fake_time.advance(wall_s=1.5, cpu_s=0.5)
    clock.mark("plan")
    fake_time.advance(wall_s=4.0, cpu_s=0.25)
    clock.mark("dispatch")
    fake_time.advance(wall_s=0.5, cpu_s=0.5)
    clock.mark("plan")  # a name marked again adds to it

    assert dict(clock.wall_s) == {"plan": 2.0, "dispatch": 4.0}
    # CPU counts from the process's start: the 2 s before the clock existed belong to the first phase
    assert dict(clock.cpu_s) == {"plan": 3.0, "dispatch": 0.25}
    assert list(clock.wall_s) == list(clock.cpu_s) == ["plan", "dispatch"]
    assert clock.elapsed_s() == sum(clock.wall_s.values())


def test_the_clock_can_start_before_it_is_built(fake_time: FakeTime) -> None:
    clock = PhaseClock(started_wall_s=90.0)
    clock.mark("start")
    assert clock.wall_s["start"] == 10.0
    assert clock.elapsed_s() == 10.0
