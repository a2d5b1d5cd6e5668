"""Starting or joining Ray: a private single-machine instance on loopback, or a given cluster.

Ray 2.60 turns ``127.0.0.1`` into the machine's network address before it binds anything
(``ray._private.services.resolve_ip_for_localhost``): measured, ``ray.init(_node_ip_address="127.0.0.1")``
advertised the machine's address and its GCS, raylet and agents listened there and on all interfaces. Ray only
keeps loopback when multi-node clustering is off (the switch Ray uses on macOS/Windows); with it off, every
listening socket of the embedded instance is on 127.0.0.1. A single-machine instance needs no clustering, so
:func:`use_loopback_only` turns it off (a private part of Ray: :mod:`.ray_private`, checked before Ray starts),
and :func:`connect` reads the sockets of its process tree once Ray is up and warns about any beyond loopback.

Ray's own console logging (its token-authentication notice, start-up lines) would land on top of a command's
progress line: :func:`connect`, which every start or join of Ray goes through, applies the command line's choice
(:mod:`.ray_console`) with :func:`quiet_ray_logging` before ``ray.init``, and never lets ``ray.init``
reconfigure logging, so the choice holds.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from distributed_onnx.runtime import ray_auth, ray_console, ray_private
from distributed_onnx.runtime.addresses import AUTO
from distributed_onnx.runtime.joining import check_ray_answers
from distributed_onnx.runtime.listening import exposed_sockets, listening_addresses
from distributed_onnx.runtime.running_ray import find_local_ray, listens_on_loopback_only

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Ray's settings for the embedded instance. No task events: they feed the dashboard and the state API, which a
#: private instance does not run, and flushing them each second cost the driver about 1 ms of CPU per second of a
#: run (``benchmarks/results/driver_cost.md``).
EMBEDDED_SYSTEM_CONFIG = {"task_events_report_interval_ms": 0}


def use_loopback_only() -> None:
    """Keep a Ray started from this process on 127.0.0.1: no node of it will advertise another address.

    Raises :class:`~distributed_onnx.errors.UnsupportedRayError` if the installed Ray lacks the switch.
    """
    ray_private.check_names(ray_private.EMBEDDED_RAY_NAMES)
    ray_private.disable_clustering()


def warn_if_exposed(root_pid: int | None = None) -> list[str]:
    """Warn about (and return) the sockets of this process tree that listen beyond loopback.

    A warning, not an error: a process that calls the Python API may have children of its own (a notebook's
    servers, a test's helper) whose sockets are not the embedded Ray's. ``distributed-onnx serve``, whose
    process tree is all its own, fails instead (``serve/operations/loopback.py``).
    """
    addresses = listening_addresses(os.getpid() if root_pid is None else root_pid)
    exposed = exposed_sockets(addresses or [])
    if exposed:
        logger.warning(
            "The embedded Ray should listen on %s only, but this process tree listens on %s (docs/design.md, "
            "Ray specifics)",
            LOOPBACK,
            ", ".join(exposed),
        )
    return exposed


#: gRPC's variable for its C core's own logging (``NONE``, ``ERROR``, ``INFO``, ``DEBUG``), read when a process
#: starts gRPC: Ray's workers inherit it from the process that starts Ray.
GRPC_VERBOSITY = "GRPC_VERBOSITY"


def quiet_ray_logging(*, quiet: bool = True) -> None:
    """Ray's own console logging at ERROR when ``quiet``, else at Ray's default INFO.

    Importing Ray (and Ray Serve) sets up their driver-side loggers (``ray``, ``ray.serve``: own handler, INFO,
    no propagation), so this must run after those imports, which this module's ``import ray`` guarantees for
    Ray; a command that serves imports Serve first. When quiet, the Serve actors an embedded Ray starts (its
    controller, proxy, replicas) log to their files under the session's log directory instead of streaming
    to this console (``RAY_SERVE_LOG_TO_STDERR=0``, unless set already); the backtest's actors still stream
    their output (``log_to_driver``): a provider fall-back warning there is ours, not Ray's chatter. gRPC's own C
    core writes to its process's stderr, past every logger (a replica that could not bind serve's ``--grpc-port``
    printed two ``add_port.cc ... Address already in use`` lines before serve's one ``error:`` line): when quiet it
    is silenced in the processes Ray starts (``GRPC_VERBOSITY=NONE``, unless set already).
    """
    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR if quiet else logging.INFO)
    if quiet:
        os.environ.setdefault(ray_private.LOG_TO_STDERR, "0")
        os.environ.setdefault(GRPC_VERBOSITY, "NONE")


def connect(address: str | None, num_cpus: int | None = None, *, stand_in_agents: bool = False) -> bool:
    """Join ``address``, or start an embedded local Ray on 127.0.0.1. Returns True if this call started Ray.

    The embedded instance is private and lean: loopback only (see the module docstring), no dashboard, no task
    events (:data:`EMBEDDED_SYSTEM_CONFIG`), and no autoscaler monitor (:func:`~.ray_private.single_node_head`:
    they cost ~1 s of ``ray.init`` and ~1 s of ``ray.shutdown`` on 2 cores,
    ``benchmarks/results/time_to_results.md``). ``stand_in_agents``, for a Ray started for one run and stopped
    after it (the backtest's :mod:`.early_start`): the raylet's two agents are stand-ins
    (:mod:`.agent_stand_in`), so no ``runtime_env`` can be built on it. For Ray's dashboard, start Ray yourself
    (``ray start --head``) and pass its address.

    ``auto`` joins the Ray that ``ray start`` left running on this machine when it listens on loopback only, with
    the authentication it runs with (:mod:`.ray_auth`), and says so once joined; else it starts the embedded one
    and says why (:mod:`.running_ray`). A token that a loopback Ray refuses is one
    :class:`~distributed_onnx.errors.RayStartError` before ``ray.init``. ``RAY_ADDRESS`` is Ray's own and keeps
    Ray's meaning.

    Ray's console lines are hidden or shown as the command line chose (:mod:`.ray_console`), before ``ray.init``
    logs its notices.
    """
    quiet = ray_console.chosen()
    if quiet is not None:
        quiet_ray_logging(quiet=quiet)
    if ray.is_initialized():
        return False
    joined = ""
    if address == AUTO:
        found = find_local_ray()
        if found.address is None:
            logger.log(logging.WARNING if found.refused else logging.INFO, "--address %s: %s", AUTO, found.reason)
        elif found.auth is not None:
            ray_auth.adopt(found.auth)  # the mode and token file of the Ray found (ray_auth.py)
        address, joined = found.address, found.reason
    address = address or os.environ.get("RAY_ADDRESS")  # Ray's own variable keeps Ray's meaning, "auto" included
    if address:  # a cluster (ray job submit sets RAY_ADDRESS for the driver it starts)
        check_ray_answers(address)  # else ray.init retries for many minutes, naming a rewritten address (joining.py)
        if listens_on_loopback_only(address):
            use_loopback_only()  # else Ray rewrites 127.0.0.1 into an address that Ray does not listen on
            ray_auth.check_token(address)  # a refused token: one line now, not Ray's retries
        ray.init(address=address, log_to_driver=True, configure_logging=False)
        if joined:  # said once joined, not before
            logger.info("--address %s: joined %s", AUTO, joined)
        return False
    use_loopback_only()
    with ray_private.single_node_head(stand_in_agents=stand_in_agents):
        ray.init(
            # "local": a new instance even where `ray start` recorded one (Ray would join that one, and refuse
            # num_cpus for it: every command failed while a user's `ray start` ran)
            address="local",
            num_cpus=num_cpus or os.cpu_count() or 1,
            _node_ip_address=LOOPBACK,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
            _system_config=EMBEDDED_SYSTEM_CONFIG,
        )
    logger.info("Started an embedded local Ray on %s", LOOPBACK)
    warn_if_exposed()
    return True


def disconnect(started_ray: bool, *, joined: bool = False) -> None:
    """Undo :func:`connect`: stop the embedded Ray this process started; a cluster's stays up for its other users.
    ``joined``: this process joined a running Ray for one run (the backtest's pool thread, :mod:`.early_start`):
    its driver disconnects now, on that thread, rather than in the interpreter's exit after the last file.

    The one place Ray is stopped, for the backtest (its pool's thread, :mod:`.early_start`) and for ``serve``.
    """
    if started_ray or joined:  # on a joined Ray, ray.shutdown() ends this driver's job only: the Ray stays up
        ray.shutdown()


def alive_nodes() -> int:
    """Nodes of the connected Ray that are alive (1 for the embedded instance)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return sum(1 for node in nodes if node.get("Alive"))
