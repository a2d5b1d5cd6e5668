"""Progress of a long job: a one-line bar on a terminal, a plain log line per interval otherwise.

One definition of throughput, used here and in ``summary.json``: windows *computed by this run* divided by
the seconds since the first part was dispatched (Ray's start-up and actor warm-up are not in it; windows a
resumed run found already done are shown apart and never counted as a rate).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

logger = logging.getLogger(__name__)


class Progress:
    """Counts windows computed against what is left; renders windows/s and the ETA."""

    def __init__(
        self,
        total: int,
        *,
        done_before: int = 0,
        label: str = "windows",
        enabled: bool | None = None,
        interval_s: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.done_before = done_before
        self.done = 0
        self._label = label
        self._stream = stream or sys.stderr
        self._bar = self._stream.isatty() if enabled is None else enabled
        self._interval_s = interval_s if not self._bar else 0.2
        self._started: float | None = None
        self._last = 0.0

    def start(self) -> None:
        """The clock of the rate starts now (the first part is being dispatched)."""
        self._started = time.perf_counter()

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self._started is None else time.perf_counter() - self._started

    @property
    def rate(self) -> float | None:
        elapsed = self.elapsed_s
        return self.done / elapsed if self.done and elapsed > 0 else None

    def advance(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self._last >= self._interval_s or self.done_before + self.done >= self.total:
            self._last = now
            self._render()

    def line(self) -> str:
        label, rate = self._label, self.rate
        left = self.total - self.done_before - self.done
        before = f" ({self.done_before:,} done before)" if self.done_before else ""
        speed = f"{rate:,.0f} {label}/s" if rate else f"- {label}/s"
        eta = f"{left / rate:5.0f}s" if rate else "    ?"
        return f"{self.done_before + self.done:,}/{self.total:,} {label}{before} | {speed} | ETA {eta}"

    def _render(self) -> None:
        if self._bar:
            width = 30
            done = self.done_before + self.done
            filled = int(width * done / self.total) if self.total else width
            self._stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line()}")
            if done >= self.total:
                self._stream.write("\n")
            self._stream.flush()
        else:
            logger.info("progress: %s", self.line())
