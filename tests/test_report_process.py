"""The report process (evaluation/driver/report_process.py): the driver's own work beside the child's drawing."""

from __future__ import annotations

from pathlib import Path

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


def test_the_child_imports_the_drivers_package_not_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first: run from a folder holding another ``distributed_onnx`` (a
    second checkout), the child imported that one, failed on the driver's requests, and the driver drew the report."""
    planted = tmp_path / "distributed_onnx"
    planted.mkdir()
    (planted / "__init__.py").write_text("open(__file__ + '.imported', 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    child = ReportProcess()
    try:
        assert child.draw(("not a request",)) is None  # answered: the child has imported its modules by now
    finally:
        child.close()
    assert not (planted / "__init__.py.imported").exists()
