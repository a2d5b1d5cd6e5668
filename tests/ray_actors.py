"""Helpers for tests that kill Ray actors on purpose."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from ray.exceptions import RayActorError


def wait_dead(actor: Any) -> None:
    """Return once a call to ``actor`` fails, so its death is certain, not a matter of timing."""
    for _ in range(1000):
        try:
            ray.get(actor.ready.remote(), timeout=60)
        except RayActorError:
            return
    pytest.fail("the killed actor kept answering")


def kill_and_wait(actor: Any) -> None:
    """Kill ``actor`` (no restart) and return once it is certainly dead."""
    ray.kill(actor, no_restart=True)
    wait_dead(actor)
