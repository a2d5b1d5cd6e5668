"""Progress of a long job: a one-line bar on a terminal, a plain log line per interval otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

logger = logging.getLogger(__name__)


class Progress:
    """Counts windows done against a total; renders windows/s and the ETA."""

    def __init__(
        self,
        total: int,
        *,
        label: str = "windows",
        enabled: bool | None = None,
        interval_s: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.done = 0
        self._label = label
        self._stream = stream or sys.stderr
        self._bar = self._stream.isatty() if enabled is None else enabled
        self._interval_s = interval_s if not self._bar else 0.2
        self._started = time.perf_counter()
        self._last = 0.0

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def advance(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self._last >= self._interval_s or self.done >= self.total:
            self._last = now
            self._render()

    def line(self) -> str:
        elapsed = max(self.elapsed_s, 1e-9)
        rate = self.done / elapsed
        remaining = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = f"{remaining:5.0f}s" if remaining != float("inf") else "    ?"
        return f"{self.done}/{self.total} {self._label} | {rate:,.0f} {self._label}/s | ETA {eta}"

    def _render(self) -> None:
        if self._bar:
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            self._stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line()}")
            if self.done >= self.total:
                self._stream.write("\n")
            self._stream.flush()
        else:
            logger.info("progress: %s", self.line())
