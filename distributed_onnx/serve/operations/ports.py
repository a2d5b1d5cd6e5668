"""The one home of serve's port conflicts: a port taken, found before Ray starts or met once the deployment binds.

Serve meets a taken port in three places: the preflight (something listens there already), Serve's own refusal
once the deployment binds (another process took a port after the preflight found it free: Ray's own processes
take ports from the kernel's ephemeral range while Ray starts) and the readiness probe (something answers on the
port, but not as Serve's proxy). Each is one ``error:`` line (exit 2) naming the address and the flag to change;
their words live here, so the three cannot drift apart. The raw lines Ray's replicas print of a failed bind
(gRPC's ``add_port.cc ... Address already in use``) are kept off the console with Ray's other lines
(:func:`~distributed_onnx.runtime.local_ray.quiet_ray_logging`; ``-v`` shows them).
"""

from __future__ import annotations

import errno
import http.client
import socket

from distributed_onnx.errors import ConfigError

__all__ = ["NO_PORT_ERROR", "check_port_free", "not_the_proxy", "taken_while_starting"]

#: What Serve says when a replica cannot bind the ports it was given (another process took one after the
#: preflight found them free: Ray's own processes take ports while Ray starts).
NO_PORT_ERROR = "NoAvailablePortError"


def check_port_free(host: str, port: int, key: str) -> None:
    """Refuse a port something already listens on, as the server would when it binds it (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"{host}:{port} is already in use; stop what listens there or choose another "
                    f"--{key.replace('_', '-')}.",
                    key=key,
                ) from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}", key=key) from None


def taken_while_starting(host: str, port: int, grpc_port: int, said: str) -> ConfigError | None:
    """The error for a deployment Serve failed because it could not bind its ports (``said``, Serve's last line of
    the deployment, names :data:`NO_PORT_ERROR`), or None for any other failure: Serve's own words name neither
    the port nor the flag."""
    if NO_PORT_ERROR not in said:
        return None
    return ConfigError(
        f"the deployment could not bind its ports ({host}:{port} HTTP, "
        f"{host}:{grpc_port} gRPC): another process took one after they were found free "
        f"(Ray's own processes take ports while Ray starts); choose free ports with --port and --grpc-port.",
        key="port",
    )


def not_the_proxy(host: str, port: int, exc: http.client.HTTPException) -> ConfigError:
    """The error for a port that answers, but not in HTTP/1.1: another process on it (the preflight found it free,
    but Ray's own processes take ports from the kernel's ephemeral range while Ray starts, and Serve's proxy then
    cannot bind it)."""
    return ConfigError(
        f"{host}:{port} answers, but not as Serve's HTTP proxy ({type(exc).__name__}): another process took the "
        f"port while Ray started (Ray's own processes take ports from the kernel's ephemeral range, "
        f"{_ephemeral_range()}); choose a --port outside that range.",
        key="port",
    )


def _ephemeral_range() -> str:
    """The kernel's ephemeral port range as ``"low-high"`` (Linux), or a description where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as found:
            low, high = found.read().split()
    except (OSError, ValueError):
        return "the ports the kernel hands out for port 0"
    return f"{low}-{high}"
