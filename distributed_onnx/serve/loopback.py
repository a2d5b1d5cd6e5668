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
that admits only the cluster's nodes is the mitigation (README, "Listening sockets"). The wrapping is applied
inside Ray's processes: in the replica by the deployment's constructor (it runs before Serve starts the
replica's servers) and in Serve's proxy through Ray's own start-up hook for it,
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (:func:`proxy_callback`). ``tests/test_loopback.py`` fails if a
Ray upgrade moves the helpers.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Environment variable carrying the host for gRPC ingress servers into Ray's processes.
GRPC_HOST_VARIABLE = "DISTRIBUTED_ONNX_GRPC_HOST"
#: Ray's hook that runs a function in each Serve proxy process before it starts its servers.
PROXY_CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "distributed_onnx.serve.loopback:proxy_callback"

_ALL_INTERFACES = "[::]:"


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
    if host in {"0.0.0.0", "::", ""}:
        return address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def pin_replica_servers(node_address: str, ingress_host: str) -> bool:
    """In a replica on a loopback node: inter-deployment gRPC on 127.0.0.1, gRPC ingress on ``ingress_host``.

    Returns whether anything was pinned (False on a cluster node, or if Ray moved the helpers: then logged).
    """
    if not is_loopback(node_address):
        return False
    try:
        from ray.serve._private import default_impl, replica
    except ImportError:  # pragma: no cover - a Ray without Serve's private modules
        return _moved("ray.serve._private.replica")
    pinned = _wrap(replica, "add_port_to_grpc_server", 1, "127.0.0.1")
    return _wrap(default_impl, "add_grpc_address", 1, ingress_host) and pinned


def proxy_callback() -> list[Any]:
    """Ray's proxy start-up hook: pin the proxy's gRPC server, add no HTTP middleware."""
    import ray

    if is_loopback(ray.util.get_node_ip_address()):  # type: ignore[no-untyped-call]
        from ray.serve._private import default_impl

        _wrap(default_impl, "add_grpc_address", 1, os.environ.get(GRPC_HOST_VARIABLE, "127.0.0.1"))
    return []


def _wrap(module: Any, name: str, address_position: int, host: str) -> bool:
    original: Callable[..., Any] | None = getattr(module, name, None)
    if original is None or not callable(original):
        return _moved(f"{module.__name__}.{name}")
    if getattr(original, "_distributed_onnx_host", None) == host:
        return True
    inner = getattr(original, "__wrapped__", original)

    def bind_on_host(*args: Any, **kwargs: Any) -> Any:
        if len(args) > address_position and isinstance(args[address_position], str):
            args = (*args[:address_position], rebind(args[address_position], host), *args[address_position + 1 :])
        return inner(*args, **kwargs)

    bind_on_host.__wrapped__ = inner  # type: ignore[attr-defined]
    bind_on_host._distributed_onnx_host = host  # type: ignore[attr-defined]
    setattr(module, name, bind_on_host)
    return True


def _moved(what: str) -> bool:
    logger.warning("Cannot keep Ray's gRPC servers on loopback: %s is gone (a newer Ray?); they listen on [::]", what)
    return False
