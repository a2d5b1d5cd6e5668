"""Readiness of a replica, judged from the model calls it already makes (pure code, no Ray, no model call).

A health check that runs a probe forecast has to share the replica's one model thread with the traffic: under
load it queues behind real batches, times out, and Serve replaces a replica that was merely busy. So the check
runs nothing. Every model call that the traffic makes reports its outcome here, and the replica is not ready
once ``max_consecutive_failures`` calls in a row failed inside the model (an ONNX Runtime error on input that
passed validation: a broken session or model, not a bad request). Non-finite outputs are not counted: they come
from a request's values (too large for the model's arithmetic) and fail that request alone with a 422, so a
client sending such values cannot take a healthy replica out of service. One success makes it
ready again. Serve's periodic ``check_health`` reads the same state, so a replica whose model keeps failing is
replaced with a fresh session, while an idle or busy one never is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelHealth:
    """Counts consecutive model failures; ``ready`` until ``max_consecutive_failures`` of them."""

    max_consecutive_failures: int
    consecutive_failures: int = 0
    last_failure: str | None = None

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    def failed(self, error: BaseException) -> None:
        self.consecutive_failures += 1
        self.last_failure = str(error)

    @property
    def ready(self) -> bool:
        return self.consecutive_failures < self.max_consecutive_failures

    @property
    def reason(self) -> str:
        """Why the replica is not ready (the message of the latest failure)."""
        return (
            f"the model failed on the last {self.consecutive_failures} calls in a row "
            f"(max_consecutive_model_failures={self.max_consecutive_failures}); last error: {self.last_failure}"
        )
