"""A Ray that ``ray start --head`` left running on this machine: found, checked, and joined instead of started.

Starting the embedded Ray is most of a short backtest's fixed cost on a small machine. A user who runs many
commands starts one Ray once, on loopback::

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address 127.0.0.1

and asks each command to join it with ``--address auto`` (or ``DISTRIBUTED_ONNX_ADDRESS=auto``). ``ray start``
records the address of the Ray it started in Ray's temp directory (``ray_current_cluster``);
:func:`find_local_ray` reads it and joins that Ray only when it is running and every socket of its processes
listens on loopback (``listening.py``). A Ray that also listens on other interfaces (``ray start`` without the
switch above listens on all of them) is joined only when the user names its address: ``auto`` then starts the
embedded Ray instead and says why. Ray's own meaning of ``auto``, any Ray found on the machine, is never used.

Joining a loopback Ray needs Ray's multi-node switch off in this process too: Ray otherwise turns the address
``127.0.0.1`` into the machine's network address, where such a Ray does not listen, and the driver waits for it
(measured: ``ray.init(address="127.0.0.1:PORT")`` against such a head retried for minutes):
:func:`listens_on_loopback_only` tells the caller when to turn it off.

A joined Ray is left as it was found: the run kills the actors it started, and disconnecting ends its driver's
job; the Ray stays up for the next command.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from distributed_onnx.runtime import ray_auth, ray_private
from distributed_onnx.runtime.listening import (
    exposed_sockets,
    listening_sockets,
    processes_listening_addresses,
    socket_inodes,
)
from distributed_onnx.runtime.ray_auth import RayAuth

#: The variables of a found Ray's environment that say how it authenticates (``ray_auth.py``).
_AUTH_VARIABLES = frozenset({ray_auth.MODE, ray_auth.TOKEN, ray_auth.TOKEN_PATH, "HOME"})


@dataclass(frozen=True)
class LocalRay:
    """What :func:`find_local_ray` found: the address to join, or None (start the embedded Ray), and why;
    ``refused``: a Ray runs, but is not joined without its address (the user should hear it); ``auth``: the
    authentication the found Ray runs with (``ray_auth.py``), when it could be read."""

    address: str | None
    reason: str
    refused: bool = False
    auth: RayAuth | None = None


def find_local_ray() -> LocalRay:
    """The Ray ``ray start`` recorded on this machine, if it runs and listens on loopback only (module docstring).

    Every reason it is not joined is its own line: no address file, one that cannot be read, one that holds no
    ``host:port``, a Ray elsewhere, one that is not running, run by another user, or listening beyond loopback.
    """
    ray_private.check_names(ray_private.RUNNING_RAY_NAMES)
    places = address_files()
    address_file = next((place for place in places if place.exists() or place.is_symlink()), None)
    if address_file is None:
        looked = " or ".join(dict.fromkeys(str(place) for place in places))
        return LocalRay(
            None,
            f"no Ray started by `ray start` on this machine ({looked} not found; a Ray whose temp directory is "
            "elsewhere is joined with --address HOST:PORT)",
        )
    recorded = _read_address_file(address_file)
    if isinstance(recorded, LocalRay):
        return recorded
    address = recorded
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return LocalRay(None, f"{address_file} holds {address!r}, not the host:port address `ray start` writes")
    if not sys.platform.startswith("linux"):
        return LocalRay(None, f"its sockets cannot be checked off Linux; pass --address {address} to join it", True)
    gcs = _listener(int(port))
    if not _is_loopback_host(host):
        if gcs is None and (_is_unspecified_host(host) or not _port_in_use(int(port))):
            return LocalRay(
                None,
                f"the Ray recorded in {address_file} ({address}) is not running on this machine (nothing listens "
                f"on port {port}); if it runs on another machine, pass --address {address} to join it",
            )
        return LocalRay(
            None,
            f"the Ray recorded in {address_file} is at {address}, not on 127.0.0.1; pass --address {address} to "
            "join it anyway",
            refused=True,
        )
    if gcs is None:
        return LocalRay(None, f"the Ray recorded in {address_file} ({address}) is not running")
    session = _session_name(gcs)
    members = _session_processes(session) if session else {gcs}
    if not all(_readable(pid) for pid in members):
        return LocalRay(None, f"the Ray at {address} runs as another user: its sockets cannot be checked", True)
    exposed = exposed_sockets(processes_listening_addresses(members))
    if exposed:
        return LocalRay(
            None,
            f"the Ray at {address} listens beyond loopback ({', '.join(exposed[:4])}); pass --address {address} "
            "to join it anyway, or start it with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (docs/cluster.md)",
            refused=True,
        )
    auth = RayAuth.from_environment(_environment(gcs))
    return LocalRay(address, f"the Ray at {address} (started by `ray start`, loopback only)", auth=auth)


def address_files() -> tuple[Path, Path]:
    """Where ``ray start`` records its address (``ray_current_cluster``), in the order looked.

    ``ray start`` writes it in its temp directory: ``--temp-dir`` where given, else ``<temp>/ray`` (``<temp>``:
    ``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else ``/tmp``). So first Ray's own place, ``<temp>/ray/``, where
    ``ray.init(address="auto")`` itself looks; then ``<temp>`` itself, where a Ray started with ``RAY_TMPDIR`` and
    ``--temp-dir`` naming one directory records it (it was looked for under ``<temp>/ray/`` only, and the command
    said "no Ray started" of a running one). A ``--temp-dir`` elsewhere cannot be known from here: the fallback
    line names both places, and such a Ray is joined by its address."""
    own = Path(ray_private.RAY_ADDRESS_FILE.get()(None))  # <temp>/ray/ray_current_cluster
    return own, Path(ray_private.RAY_ADDRESS_FILE.get()(str(own.parent.parent)))


def _read_address_file(address_file: Path) -> str | LocalRay:
    """The address ``ray start`` recorded, or why there is none to join (the embedded Ray then starts)."""
    try:
        address = address_file.read_bytes().decode().strip()
    except FileNotFoundError:
        return LocalRay(None, f"no Ray started by `ray start` on this machine ({address_file} not found)")
    except UnicodeDecodeError:
        return LocalRay(None, f"{address_file} is not text: not an address `ray start` writes")
    except OSError as unreadable:
        what = "a directory, not a file" if address_file.is_dir() else unreadable.strerror or str(unreadable)
        return LocalRay(None, f"{address_file} could not be read ({what})")
    if not address:
        return LocalRay(None, f"{address_file} is empty: no Ray address recorded")
    return address


def listens_on_loopback_only(address: str) -> bool:
    """Whether ``host:port`` is a loopback address whose port this machine listens on, on loopback only.

    Such a Ray is joined with Ray's multi-node switch off in this process (module docstring); a Ray whose port
    also listens on other interfaces is reached as Ray reaches it by default.
    """
    host, _, port = address.rpartition(":")
    if not _is_loopback_host(host) or not port.isdigit():
        return False
    listening = [each for each in listening_sockets() if int(each[0].rsplit(":", 1)[1]) == int(port)]
    return bool(listening) and not exposed_sockets(each for each, _ in listening)


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_unspecified_host(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _port_in_use(port: int) -> bool:
    """Whether anything on this machine listens on ``port`` (on any address)."""
    return any(int(address.rsplit(":", 1)[1]) == port for address, _ in listening_sockets())


def _environment(pid: int) -> dict[str, str]:
    """What ``pid``'s environment says about Ray's authentication (empty if unreadable): the mode, the token file,
    HOME; a token itself only as present (its value is never read out)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if b"=" in entry)
    kept = {key: ("" if key == ray_auth.TOKEN else value) for key, _, value in pairs if key in _AUTH_VARIABLES}
    return kept


def gcs_listener(port: int) -> tuple[int, str] | None:
    """The process listening on a Ray's GCS ``port`` on this machine and its Ray session (None: none, or not a
    Ray process this user can read): what the watch of a joined Ray watches (``ray_watch.py``)."""
    pid = _listener(port)
    session = _session_name(pid) if pid is not None else None
    return (pid, session) if pid is not None and session else None


def _listener(port: int) -> int | None:
    """The process listening on ``port`` (None: nothing listens, or not a process this user can read)."""
    inodes = {inode for address, inode in listening_sockets() if int(address.rsplit(":", 1)[1]) == port}
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and socket_inodes(int(entry.name)) & inodes:
            return int(entry.name)
    return None


def _readable(pid: int) -> bool:
    """Whether this user can read ``pid``'s open files (a process that is gone counts as read: it holds none)."""
    try:
        os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _session_name(pid: int) -> str | None:
    """The Ray session a process belongs to (``--session-name=`` on the GCS's command line)."""
    for argument in _command_line(pid).split():
        if argument.startswith("--session-name="):
            return argument.removeprefix("--session-name=") or None
    return None


def session_processes(session: str) -> set[int]:
    """Every process of a Ray session on this machine (:func:`_session_processes`)."""
    return _session_processes(session)


def _session_processes(session: str) -> set[int]:
    """Every process whose command line names the session (GCS, raylet, agents, dashboard, monitors, workers)."""
    return {
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != os.getpid() and session in _command_line(int(entry.name))
    }
