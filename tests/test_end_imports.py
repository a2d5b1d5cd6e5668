"""The end's imports on their thread (evaluation/driver/end_imports.py): a failure there stays there."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from distributed_onnx.evaluation.driver import end_imports
from distributed_onnx.evaluation.report import plots


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What escapes a thread (``threading.excepthook``), recorded instead of printed."""
    errors: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    return errors


def test_a_failing_warm_up_is_left_to_the_report(monkeypatch: pytest.MonkeyPatch, thread_errors: list[Any]) -> None:
    def broken() -> None:
        raise RuntimeError("no fonts here")

    monkeypatch.setattr(plots, "warm_up", broken)
    thread = end_imports.start_end_imports()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert thread_errors == []  # logged at debug on the thread; the report meets the error again, and notes it
