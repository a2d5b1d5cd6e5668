"""Which TCP addresses a process tree listens on, read from /proc (Linux; no extra dependency).

The embedded Ray promises that every socket of its process tree listens on 127.0.0.1 (``local_ray`` and
``serve/operations/loopback.py`` make it so). :func:`exposed_sockets` checks that promise at run time, after Ray and
Serve are up; ``tests/test_loopback.py`` checks it too, with an unauthenticated client on every socket. Elsewhere than
Linux nothing is read and the check reports nothing (:func:`listening_addresses` returns None).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Collection, Iterable
from pathlib import Path

LISTEN_STATE = "0A"  #: the TCP state LISTEN in /proc/net/tcp*


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def listening_addresses(root_pid: int) -> list[str] | None:
    """``host:port`` of every listening TCP socket held by ``root_pid`` and its descendants (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return processes_listening_addresses(process_tree(root_pid))


def processes_listening_addresses(pids: Iterable[int]) -> list[str]:
    """``host:port`` of every listening TCP socket held by one of ``pids`` (Linux: read from /proc)."""
    inodes: set[int] = set()
    for pid in pids:
        inodes |= socket_inodes(pid)
    return sorted(address for address, inode in listening_sockets() if inode in inodes)


def listening_sockets() -> list[tuple[str, int]]:
    """``(host:port, socket inode)`` of every listening TCP socket of this machine's network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN_STATE:
                found.append((decode_address(fields[1]), int(fields[9])))
    return found


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` (as :func:`listening_addresses` writes it) is a loopback address."""
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def exposed_sockets(addresses: Iterable[str], allowed_ports: Collection[int] = ()) -> list[str]:
    """The addresses beyond loopback, except on ``allowed_ports`` (those a user asked for, or documented)."""
    return [
        address
        for address in addresses
        if not is_loopback(address) and int(address.rsplit(":", 1)[1]) not in allowed_ports
    ]


def decode_address(address: str) -> str:
    """``0100007F:1F90`` (/proc/net/tcp's hex) -> ``127.0.0.1:8080``; IPv6 too."""
    host, port = address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def socket_inodes(pid: int) -> set[int]:
    """The inodes of ``pid``'s sockets (none: the process is gone, or not this user's to read)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed while we looked
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # the process ended, or is not ours to read
        pass
    return inodes
