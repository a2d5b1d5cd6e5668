"""A recurring problem logged at most once a period: shared by the log's writer and the serving side's recorders
(apart from the writer, which imports the failure recorder that uses it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from distributed_onnx.redact import redact_text

logger = logging.getLogger(__name__)


class ThrottledWarning:
    """Log a recurring problem at most once per ``period_s``, saying how often it recurred in between."""

    def __init__(
        self, period_s: float, clock: Callable[[], float] = time.monotonic, log: logging.Logger = logger
    ) -> None:
        self.period_s = period_s
        self._clock = clock
        self._log = log
        self._last: float | None = None
        self._suppressed = 0

    def warn(self, message: str, *args: Any) -> bool:
        """Log ``message % args`` unless one was logged less than ``period_s`` ago; True when it was logged."""
        now = self._clock()
        if self._last is not None and now - self._last < self.period_s:
            self._suppressed += 1
            return False
        suffix = f" ({self._suppressed} more since the last warning)" if self._suppressed else ""
        self._log.warning("%s", redact_text((message + suffix) % args))  # in a replica: its URL's secrets stay there
        self._last, self._suppressed = now, 0
        return True
