"""Starting or joining Ray: a private single-machine instance on loopback, or a given cluster.

Ray 2.60 turns ``127.0.0.1`` into the machine's network address before it binds anything
(``ray._private.services.resolve_ip_for_localhost``): measured here, ``ray.init(_node_ip_address="127.0.0.1")``
advertised 192.0.2.2 and its GCS, raylet and agents listened there and on all interfaces. Ray only keeps
loopback when multi-node clustering is off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the switch Ray uses
on macOS/Windows); with it, every listening socket of the embedded instance was on 127.0.0.1 (``ss -ltnp``).
A single-machine instance needs no clustering, so :func:`use_loopback_only` turns it off.

Ray's own console logging (its token-authentication notice, start-up lines) would land on top of a command's
progress line: the commands call :func:`quiet_ray_logging`, and :func:`connect` never lets ``ray.init``
reconfigure logging, so the choice holds.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray._private import ray_constants

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_CLUSTERING_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def use_loopback_only() -> None:
    """Keep a Ray started from this process on 127.0.0.1: no node of it will advertise another address.

    The environment variable reaches the processes Ray starts (GCS, raylet, workers), which read it at
    import; this process imported Ray already, so its constant is set as well.
    """
    os.environ[_CLUSTERING_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def quiet_ray_logging(*, quiet: bool = True) -> None:
    """Ray's own console logging at ERROR when ``quiet``, else at Ray's default INFO.

    Importing Ray (and Ray Serve) sets up their driver-side loggers (``ray``, ``ray.serve``: own handler, INFO,
    no propagation), so this must run after those imports, which this module's ``import ray`` guarantees for
    Ray; a command that serves imports Serve first. When quiet, the Serve actors an embedded Ray starts (its
    controller, proxy, replicas) log to their files under the session's log directory instead of streaming
    to this console (``RAY_SERVE_LOG_TO_STDERR=0``, unless set already); the backtest's actors still stream
    their output (``log_to_driver``): a provider fall-back warning there is ours, not Ray's chatter.
    """
    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR if quiet else logging.INFO)
    if quiet:
        os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join ``address``, or start an embedded local Ray on 127.0.0.1. Returns True if this call started Ray.

    The embedded instance is private: loopback only (see the module docstring) and no dashboard.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster (ray job submit sets RAY_ADDRESS for the driver it starts)
        ray.init(address=address, log_to_driver=True, configure_logging=False)
        return False
    use_loopback_only()
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 1,
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
    )
    logger.info("Started an embedded local Ray on %s", LOOPBACK)
    return True


def alive_nodes() -> int:
    """Nodes of the connected Ray that are alive (1 for the embedded instance)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return sum(1 for node in nodes if node.get("Alive"))
