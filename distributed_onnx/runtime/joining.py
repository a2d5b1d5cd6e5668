"""Whether a Ray answers at the address a command was told to join, asked within a deadline before ``ray.init``.

``ray.init(address=HOST:PORT)`` where no Ray listens does not fail: its GCS client retries, twenty times by
default, each try waiting on Ray's own connect and cluster-id timeouts, and logs only Ray's C++ warnings meanwhile
(``Failed to connect to GCS at address ...``) - a command given a wrong address hung for many minutes. And for a
loopback address on which nothing listens, Ray first rewrites ``127.0.0.1`` into this machine's network address
(``ray._private.services.resolve_ip_for_localhost``, :mod:`.running_ray`), so its warnings named an address the
user never gave. :func:`check_ray_answers` asks the address itself, with a plain TCP connection bounded by
:data:`JOIN_TIMEOUT_S`, and refuses it in one line naming the address given (exit 3: the environment), before
Ray is asked anything. A port that accepts but is not a Ray's GCS is caught by the caller's own deadline on the
connect (``early_start.EarlyStart.wait``).
"""

from __future__ import annotations

import socket

from distributed_onnx.errors import RayStartError
from distributed_onnx.runtime.addresses import AUTO, host_and_port

#: Seconds a command waits for the address it joins to accept a connection, and for Ray's join to finish.
JOIN_TIMEOUT_S = 30.0


def check_ray_answers(address: str, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Raise :class:`RayStartError` naming ``address`` unless something accepts a connection there within
    ``timeout_s``. ``auto`` and what is not ``HOST:PORT`` (``RAY_ADDRESS``'s other forms) are left to Ray."""
    if address == AUTO:
        return
    try:
        host, port = host_and_port(address)
    except ValueError:
        return
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except TimeoutError:
        why = f"nothing accepted a connection within {timeout_s:g} s"
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    raise RayStartError(
        f"No Ray answered at {address} ({why}). Start one there (ray start --head, on port {port}) or give the "
        "address of a running Ray's head (ray status shows it) with --address; leave --address out for an "
        "embedded Ray.",
        address=address,
    )
