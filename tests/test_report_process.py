"""The report process (evaluation/driver/report_process.py): the driver's own work beside the child's drawing."""

from __future__ import annotations

import pytest

from distributed_onnx.evaluation.driver.report_process import ReportProcess


def test_the_drivers_own_work_runs_while_the_child_draws_and_its_failure_stops_the_child() -> None:
    """``meanwhile`` (the driver writing metrics.parquet) runs once the request is sent, the child still there;
    a child that cannot draw is the caller's to replace (None), and a ``meanwhile`` that fails stops the child."""
    child = ReportProcess()
    alive: list[int | None] = []
    drawn = child.draw(("not a request",), meanwhile=lambda: alive.append(child._process.poll()))
    assert alive == [None] and drawn is None  # ran once, beside the child; the child could not draw this

    child = ReportProcess()

    def failing() -> None:
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        child.draw(("not a request",), meanwhile=failing)
    assert child._process.poll() is not None
