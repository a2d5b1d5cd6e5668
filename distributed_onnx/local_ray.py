"""Starting or joining Ray: a private single-machine instance bound to 127.0.0.1, or a given cluster."""

from __future__ import annotations

import logging
import os

import ray

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join ``address``, or start an embedded local Ray on 127.0.0.1. Returns True if this call started Ray.

    A plain ``ray.init()`` advertises the machine's network address; the embedded instance must stay private,
    so it binds to loopback and runs without the dashboard.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster (ray job submit sets RAY_ADDRESS for the driver it starts)
        ray.init(address=address, log_to_driver=True)
        return False
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 1,
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
    )
    logger.info("Started an embedded local Ray on %s", LOOPBACK)
    return True
