"""The Ray addresses the commands take, parsed once and apart from the code that acts on them.

Planning asks whether a run joins this machine's Ray (its parts are then sized for this machine's CPUs) without
importing what finds and joins that Ray (:mod:`.running_ray`), whose messages name the ``--address`` flag of the
commands that have one. :func:`check_address` is the one parse of ``--address`` that every command's settings
run (``backtest``, ``fev``, ``serve``): a value Ray could not parse is refused as a bad setting before anything
starts, not met as Ray's own ``ValueError`` once Ray is imported.
"""

from __future__ import annotations

import ipaddress
import re

from distributed_onnx.redact import redact_address

#: The address that asks for the Ray ``ray start`` left running on this machine (:func:`.running_ray.find_local_ray`).
AUTO = "auto"

_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$")


def check_address(value: str) -> str:
    """``value`` if it is :data:`AUTO` or ``HOST:PORT`` (a name, an IPv4 address or ``[IPv6]``, and a port from 1
    to 65535), else ValueError saying what was expected and what was seen:

    >>> check_address("127.0.0.1:6379"), check_address("auto"), check_address("[::1]:6379")
    ('127.0.0.1:6379', 'auto', '[::1]:6379')
    >>> check_address("garbage:xyz")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: expected HOST:PORT of a running Ray (e.g. 127.0.0.1:6379) or auto, got 'garbage:xyz': its port ...

    ``auto`` in any case is :data:`AUTO` (``AUTO`` was refused as "no HOST:PORT"); a port is ASCII digits only
    (``int()`` reads other scripts' digits, so ``127.0.0.1:\\u0661`` was port 1):

    >>> check_address("AUTO")
    'auto'
    """
    if value.lower() == AUTO:
        return AUTO
    host, colon, port = value.rpartition(":")
    shown = redact_address(value)
    expected = f"expected HOST:PORT of a running Ray (e.g. 127.0.0.1:6379) or {AUTO}, got {shown!r}"
    if not colon or not host:
        raise ValueError(f"{expected}: it has no HOST:PORT")
    # A part is quoted only when the value holds no secret: ``ray://K:S@h:1?tok=T`` has the port ``1?tok=T``, which
    # no redaction of the part alone would mask (the whole, masked, is shown once above).
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        part = f" {port!r}" if shown == value else ""
        raise ValueError(f"{expected}: its port{part} is not a number from 1 to 65535")
    if not _is_host(host):
        part = f" {host!r}" if shown == value else ""
        raise ValueError(f"{expected}: its host{part} is not a host name or an IP address")
    return value


def check_address_or_none(value: str | None) -> str | None:
    """:func:`check_address` as the settings' validator of an optional ``address`` (None: an embedded Ray)."""
    return None if value is None else check_address(value)


def host_and_port(address: str) -> tuple[str, int]:
    """The host (IPv6 without its brackets) and port of a :func:`check_address`-ed ``HOST:PORT``."""
    host, _, port = check_address(address).rpartition(":")
    return host.strip("[]"), int(port)


def _is_host(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            return ipaddress.ip_address(host).version == 6
        except ValueError:
            return False
    return bool(_HOST_NAME.match(host))
