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
import re
import socket

from distributed_onnx.errors import ConfigError, DistributedOnnxError, EnvironmentFailedError

__all__ = [
    "NO_PORT_ERROR",
    "check_port_free",
    "ephemeral_low",
    "not_the_proxy",
    "proxy_could_not_bind",
    "taken_while_starting",
]

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
    found = _read_ephemeral_range()
    return "the ports the kernel hands out for port 0" if found is None else f"{found[0]}-{found[1]}"


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, where it cannot be read)."""
    found = _read_ephemeral_range()
    return 32768 if found is None else found[0]


def _read_ephemeral_range() -> tuple[int, int] | None:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as found:
            low, high = found.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def proxy_could_not_bind(host: str, user_ports: tuple[int, int], error: BaseException) -> DistributedOnnxError | None:
    """The error for Serve's proxy failing to bind its gRPC port when Serve starts (Ray's ``Failed to bind to
    address HOST:PORT`` inside a task error), or None for any other failure. The user's port: their flag to
    change (exit 2); a port this command chose for the unused proxy: another process took it meanwhile, so
    running again is the remedy (exit 3), not a flag."""
    found = _BIND_FAILED.search(str(error))
    if found is None:
        return None
    port = int(found.group(1))
    if port in user_ports:
        return taken_while_starting(host, user_ports[0], user_ports[1], NO_PORT_ERROR)
    return EnvironmentFailedError(
        f"Serve's proxy could not bind {host}:{port}, a loopback port this command chose for it (not one of yours): "
        "another process took it while Ray started; run the command again."
    )


_BIND_FAILED = re.compile(r"Failed to bind to address \S*?:(\d+)")
