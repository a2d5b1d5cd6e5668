"""The loopback ports serve picks for itself (Serve's unused proxy, HAProxy's stats) and a proxy that cannot bind.

A whole suite run once failed on ``internal error: RayTaskError(RuntimeError) ... ProxyActor.ready() ... Failed to
bind to address 127.0.0.1:33321``: with direct ingress, Serve's proxy got a port the kernel handed out for port 0,
and one of Ray's own processes, which bind port 0 while Ray starts, took it first.
"""

from __future__ import annotations

from distributed_onnx.errors import ConfigError, EnvironmentFailedError
from distributed_onnx.serve.operations.ingress import HIDDEN_PORTS_FIRST, free_port
from distributed_onnx.serve.operations.ports import ephemeral_low, proxy_could_not_bind

RAY_SAID = (
    "RayTaskError(RuntimeError): ray::ProxyActor.ready() (pid=13835, ip=127.0.0.1) ... RuntimeError: Failed to "
    "bind to address 127.0.0.1:{port}; set GRPC_VERBOSITY=debug environment variable to see detailed error message."
)


def test_the_ports_serve_picks_for_itself_lie_outside_the_kernels_ephemeral_range() -> None:
    picked = {free_port() for _ in range(50)}
    assert all(HIDDEN_PORTS_FIRST <= port < ephemeral_low() for port in picked), sorted(picked)
    assert len(picked) > 1  # at random, so two serves starting together do not pick one port


def test_a_proxy_that_cannot_bind_is_one_line_naming_the_port_and_the_remedy() -> None:
    hidden = proxy_could_not_bind("127.0.0.1", (28000, 28001), RuntimeError(RAY_SAID.format(port=24567)))
    assert isinstance(hidden, EnvironmentFailedError) and hidden.exit_code == 3
    assert "127.0.0.1:24567" in str(hidden) and "not one of yours" in str(hidden)
    assert "run the command again" in str(hidden)

    users = proxy_could_not_bind("127.0.0.1", (28000, 28001), RuntimeError(RAY_SAID.format(port=28001)))
    assert isinstance(users, ConfigError)
    assert "--grpc-port" in str(users) and "127.0.0.1:28001" in str(users)

    assert proxy_could_not_bind("127.0.0.1", (28000, 28001), RuntimeError("something else")) is None
