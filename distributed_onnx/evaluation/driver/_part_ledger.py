"""What the driver knows of a run's parts as the dispatcher reports them: receipts, failures, the next deadline.

Kept apart from the run (``run.py``) because it is pure bookkeeping: the deadline of a part's next attempt
follows from the rates of the receipts so far (:mod:`._deadlines`), and the first receipt's time is the run's
first forecast (``summary.json``).
"""

from __future__ import annotations

from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.driver._deadlines import AttemptDeadlines
from distributed_onnx.evaluation.driver._outcome import PartFailure
from distributed_onnx.evaluation.part_messages import PartReceipt


class PartLedger:
    """Receipts and failures as the dispatcher delivers them, and what the next part's deadline follows from."""

    def __init__(self) -> None:
        self.receipts: list[PartReceipt] = []
        self.failures: list[PartFailure] = []
        self.deadlines = AttemptDeadlines()
        self.first_result_s: float | None = None

    def add_receipt(self, receipt: PartReceipt, elapsed_s: float) -> None:
        self.receipts.append(receipt)
        self.deadlines.observe(receipt.windows, sum(receipt.seconds.values()))
        if self.first_result_s is None:
            self.first_result_s = elapsed_s

    def deadline_s(self, part: PartSpec, part_timeout_s: float | None) -> float:
        """The given timeout, else one that fits the part: its windows times the slowest rate per window so far
        (:mod:`._deadlines`)."""
        return part_timeout_s if part_timeout_s is not None else self.deadlines.deadline_s(part.n_windows)
