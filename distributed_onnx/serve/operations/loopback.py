"""Keep Ray Serve's gRPC servers on loopback when the whole Ray instance is on loopback (embedded Ray).

Ray Serve 2.60 binds its gRPC servers to all interfaces, with the address hard-coded: each replica's
inter-deployment server on ``[::]:0`` (``ray/serve/_private/replica.py``) and the gRPC ingress (Serve's proxy
and direct-ingress replicas) on ``[::]:<port>`` (``ray/serve/_private/grpc_util.py`` through
``default_impl.add_grpc_address``). On this project's embedded single-machine Ray every other Ray socket is on
127.0.0.1 (:mod:`distributed_onnx.runtime.local_ray`), so these were the only ones reachable from the network.

What an unauthenticated client gets from the inter-deployment port (measured here, Ray 2.60, see
``tests/test_loopback.py``): with token authentication on (Ray's default) every call is refused with
``UNAUTHENTICATED: Invalid or missing authentication token`` before the request is read. With token
authentication off (``RAY_AUTH_MODE=disabled``) the replica unpickles the request's metadata
(``ASGIRequest.pickled_request_metadata``): any client that reaches the port runs code in the replica.

The mitigation here: where the replica's (or proxy's) node address is loopback, the two helpers that bind
those servers are wrapped so that ``[::]`` becomes the configured host (127.0.0.1 unless the user's ``--host``
says otherwise). Nothing changes on a real cluster, where other nodes must reach these ports: there a firewall
that admits only the cluster's nodes is the mitigation (docs/serving.md, "Listening sockets"). The wrapping is applied
inside Ray's processes: in the replica by the deployment's constructor (it runs before Serve starts the
replica's servers) and in Serve's proxy through Ray's own start-up hook for it,
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (:func:`proxy_callback`). The helpers are private to Ray: they are
named in :mod:`distributed_onnx.runtime.ray_private`, which checks before Serve starts that they still exist.

Once the deployment is ready, :func:`check_listening` reads the sockets of the process tree and fails if any
listens beyond loopback where the user did not ask for it, so the promise is checked on every start, not only
by ``tests/test_loopback.py`` (which also probes each socket with an unauthenticated client).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from distributed_onnx.errors import LoopbackError
from distributed_onnx.runtime import ray_private
from distributed_onnx.runtime.listening import exposed_sockets, listening_addresses

logger = logging.getLogger(__name__)

#: Environment variable carrying the host for gRPC ingress servers into Ray's processes.
GRPC_HOST_VARIABLE = "DISTRIBUTED_ONNX_GRPC_HOST"
#: Ray's hook that runs a function in each Serve proxy process before it starts its servers.
PROXY_CALLBACK_VARIABLE = ray_private.PROXY_CALLBACK
PROXY_CALLBACK = "distributed_onnx.serve.operations.loopback:proxy_callback"

_ALL_INTERFACES = "[::]:"
_ANY_HOST = {"0.0.0.0", "::", ""}


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def rebind(address: str, host: str) -> str:
    """``[::]:PORT`` -> ``HOST:PORT`` (IPv6 hosts bracketed); any other address unchanged."""
    if not address.startswith(_ALL_INTERFACES):
        return address
    port = address[len(_ALL_INTERFACES) :]
    if host in _ANY_HOST:
        return address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def pin_replica_servers(node_address: str, ingress_host: str) -> bool:
    """In a replica on a loopback node: inter-deployment gRPC on 127.0.0.1, gRPC ingress on ``ingress_host``.

    Returns whether anything was pinned (False on a cluster node, or if Ray moved the helpers: then logged).
    """
    if not is_loopback(node_address):
        return False
    pinned = ray_private.wrap_address_argument(ray_private.REPLICA_GRPC_PORT, "127.0.0.1", rebind)
    return ray_private.wrap_address_argument(ray_private.GRPC_INGRESS_ADDRESS, ingress_host, rebind) and pinned


def proxy_callback() -> list[Any]:
    """Ray's proxy start-up hook: pin the proxy's gRPC server, add no HTTP middleware."""
    import ray

    if is_loopback(ray.util.get_node_ip_address()):  # type: ignore[no-untyped-call]
        host = os.environ.get(GRPC_HOST_VARIABLE, "127.0.0.1")
        ray_private.wrap_address_argument(ray_private.GRPC_INGRESS_ADDRESS, host, rebind)
    return []


def allowed_ports(host: str, ports: Collection[int], environment: Mapping[str, str]) -> set[int]:
    """The ports that may listen beyond loopback.

    With a ``--host`` beyond loopback: the Serve ports (``ports``: the user's and those of Serve's own proxy) and
    the direct-ingress ranges the replicas take in ``environment``. Always: the two ports Ray's HAProxy template
    binds on all interfaces (stats page, Prometheus exporter; docs/serving.md, Listening sockets).
    """
    allowed: set[int] = set()
    if not is_loopback(host):
        allowed |= set(ports)
        for protocol in ray_private.INGRESS_PROTOCOLS:
            low, high = ray_private.direct_ingress_port_bounds(protocol)
            if low in environment and high in environment:
                allowed |= set(range(int(environment[low]), int(environment[high])))
    if environment.get(ray_private.HA_PROXY) == "1":
        for variable in (ray_private.HAPROXY_STATS_PORT, ray_private.HAPROXY_METRICS_PORT):
            if variable in environment:
                allowed.add(int(environment[variable]))
    return allowed


def check_listening(
    root_pid: int,
    allowed: Collection[int],
    read: Callable[[int], list[str] | None] = listening_addresses,
) -> list[str]:
    """Raise :class:`LoopbackError` naming every socket of the process tree beyond loopback not in ``allowed``.

    Returns the addresses read (none off Linux, where nothing is checked).
    """
    addresses = read(root_pid)
    if addresses is None:
        return []
    exposed = exposed_sockets(addresses, allowed)
    if exposed:
        raise LoopbackError(
            f"the embedded Ray should listen on loopback only, but {', '.join(exposed)} listen(s) beyond it "
            f"(Ray other than {ray_private.TESTED_RAY}.x?); stopped. See docs/serving.md, Listening sockets.",
            exposed=exposed,
        )
    return addresses
