"""Notice that the Ray a long-running command relies on is gone, before Ray's own C++ core ends the process.

When the GCS of the Ray a driver is connected to stops, Ray's core worker retries for
``gcs_rpc_server_reconnect_timeout_s`` (60 s by default), then logs "Failed to connect to GCS ... The program will
terminate" from a background thread and aborts the process: no ``error:`` line, no exit code of the project's, and
the embedded Ray's raylet, agents and workers left running (measured under ``serve``, issue 46, and under a
backtest joined to a ``ray start`` head). The one watch of every command, :func:`watch_connected_ray` (``serve``
polls it in its main loop, the backtest on a thread of :mod:`.early_start`), sees the loss within a second or two:

- the embedded Ray (started by this process): its ``gcs_server`` and ``raylet`` are this process's children, read
  from /proc when the watch starts; one that exited is the loss (they never restart);
- a Ray joined on this machine (``--address auto``, or its loopback address: ``ray start --head`` as
  docs/cluster.md says): the ``gcs_server`` listening on the joined address and the ``raylet`` this driver is
  connected to (its node id on the command line), found in /proc as :mod:`.running_ray` finds a head's processes;
  a GCS without external storage never restarts, so one that exited is the loss;
- any other cluster: the GCS address (``ray.get_runtime_context().gcs_address``) is probed with a TCP connect; a
  GCS may restart (fault-tolerant GCS), so only one that refused or timed out for :data:`CLUSTER_GRACE_S` on end is
  the loss, well inside Ray's own window.

:func:`abandon_lost_ray` then stops what the embedded Ray left and takes ``ray.shutdown`` off the exit handlers
(it would wait on the dead GCS until Ray's core aborts the process).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from distributed_onnx.runtime.listening import process_tree
from distributed_onnx.runtime.running_ray import gcs_listener, session_processes

logger = logging.getLogger(__name__)

#: The embedded Ray's processes whose end is the end of the instance (neither restarts).
VITAL_PROCESSES = ("gcs_server", "raylet")
#: How long a cluster's GCS may not answer before the watch calls it lost (Ray's own window is 60 s).
CLUSTER_GRACE_S = 20.0


def _status(pid: int) -> str | None:
    """The process state letter of ``pid`` (``Z`` a zombie), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot: /proc's field 22), to tell it from a later process of that pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def vital_children(parent: int) -> dict[int, str]:
    """``parent``'s direct children named in :data:`VITAL_PROCESSES` (pid -> name; empty off Linux)."""
    found: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        pid = int(stat.parent.name)
        name = _name(pid)
        if ppid == parent and name in VITAL_PROCESSES:
            found[pid] = name
    return found


def gcs_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


@dataclass
class RayWatch:
    """Polled by a long-running command: :meth:`lost` is None while Ray is there, else the line saying why not."""

    #: The vital processes of a Ray on this machine (pid -> name); empty when joined to a remote cluster.
    processes: dict[int, str] = field(default_factory=dict)
    #: Whose processes they are, in the line that says one exited.
    owner: str = "the embedded Ray"
    #: The process that started the embedded Ray: its tree is remembered every ``remember_every_s`` while Ray is
    #: there, since a killed raylet's workers are no longer in it once it is lost (they are re-parented).
    root: int | None = None
    remember_every_s: float = 5.0
    #: The cluster's GCS ``host:port`` when joined to one.
    gcs_address: str | None = None
    grace_s: float = CLUSTER_GRACE_S
    #: Seconds between two probes of the GCS (a TCP connect each): :meth:`lost` is polled more often.
    probe_every_s: float = 2.0
    probe: Callable[[str], bool] = gcs_answers
    clock: Callable[[], float] = time.monotonic
    _silent_since: float | None = None
    _probed_at: float | None = None
    _tree: dict[int, str | None] = field(default_factory=dict)
    _remembered_at: float | None = None

    @classmethod
    def embedded(cls, parent: int | None = None) -> RayWatch:
        """The watch of the Ray this process started (its children, read now: call it once Ray is up)."""
        root = os.getpid() if parent is None else parent
        watch = cls(processes=vital_children(root), root=root)
        watch._remember()
        return watch

    def lost(self) -> str | None:
        for pid, name in self.processes.items():
            if _status(pid) in (None, "Z", "X"):
                return f"{self.owner}'s {name} (pid {pid}) exited"
        now = self.clock()
        if self._remembered_at is None or now - self._remembered_at >= self.remember_every_s:
            self._remember()
        if self.gcs_address is None:
            return None
        if self._probed_at is not None and now - self._probed_at < self.probe_every_s:
            return None
        self._probed_at = now
        if self.probe(self.gcs_address):
            self._silent_since = None
            return None
        if self._silent_since is None:
            self._silent_since = now
        if now - self._silent_since >= self.grace_s:
            return f"the Ray cluster's GCS at {self.gcs_address} has not answered for {self.grace_s:.0f} s"
        return None

    def _remember(self) -> None:
        if self.root is not None:
            self._remembered_at = self.clock()
            self._tree = {pid: _start_time(pid) for pid in process_tree(self.root) - {self.root}}

    def remembered(self) -> set[int]:
        """The processes of the embedded Ray's tree when last remembered that still run (the same processes: the
        pid's start time unchanged)."""
        return {pid for pid, started in self._tree.items() if started is not None and _start_time(pid) == started}


def watch_connected_ray(started_ray: bool) -> RayWatch:
    """The one watch of the Ray this process is connected to (module docstring): the embedded Ray's processes
    when this process started it, a joined Ray's on this machine, else the cluster's GCS. Call it once Ray is up
    (its processes are read now)."""
    import ray

    if started_ray:
        watch = RayWatch.embedded()
        if watch.processes:
            return watch
    context = ray.get_runtime_context()
    address = str(context.gcs_address)
    local = joined_vital_processes(address, str(context.get_node_id()))
    if local:
        return RayWatch(processes=local, owner=f"the Ray at {address}")
    return RayWatch(gcs_address=address)


def joined_vital_processes(gcs_address: str, node_id: str) -> dict[int, str]:
    """The ``gcs_server`` listening on ``gcs_address`` on this machine and the ``raylet`` of node ``node_id`` in
    its session (pid -> name); empty when the GCS is not a process of this machine this user can read, or either
    is not found (the GCS is then probed instead)."""
    host, _, port = gcs_address.rpartition(":")
    if not port.isdigit() or host.strip("[]") not in {"127.0.0.1", "localhost", "::1"}:
        return {}
    found = gcs_listener(int(port))
    if found is None:
        return {}
    gcs, session = found
    raylets = [
        pid
        for pid in session_processes(session)
        if _name(pid) == "raylet" and f"--node_id={node_id}" in _command_line(pid)
    ]
    if _name(gcs) != "gcs_server" or len(raylets) != 1:
        return {}
    return {gcs: "gcs_server", raylets[0]: "raylet"}


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_workers(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that still run as Ray workers on this machine (Ray names them ``ray::...``)."""
    return [pid for pid in pids if (_name(pid) or "").startswith("ray::") and _status(pid) not in (None, "Z", "X")]


def abandon_lost_ray(started_ray: bool, watch: RayWatch | None, also: Iterable[int] = ()) -> None:
    """Stop what is left of a lost Ray without asking it (``ray.shutdown``, ``ray.kill`` would wait on the dead
    GCS until Ray's core aborts the process): ``ray.shutdown`` is taken off the exit handlers, the embedded
    instance's processes (this process's descendants) and ``also`` (this run's actors on a joined Ray of this
    machine) are stopped by signal."""
    with contextlib.suppress(ImportError):
        import ray

        atexit.unregister(ray.shutdown)
    others = set(also)
    if started_ray:
        others |= watch.remembered() if watch is not None else set()
        left = stop_process_tree(os.getpid(), also=others)
    else:
        left = stop_process_tree(os.getpid(), also=others, descendants=False) if others else []
    if left:
        logger.warning("Processes of the lost Ray still running after SIGKILL: %s", left)


def stop_process_tree(
    root: int, timeout_s: float = 3.0, also: Iterable[int] = (), *, descendants: bool = True
) -> list[int]:
    """SIGTERM every descendant of ``root`` (not ``root``; none when not ``descendants``) and ``also``, SIGKILL
    those left after ``timeout_s``; returns those that still had not exited (zombies excepted) after the SIGKILL."""
    stopped = ((process_tree(root) if descendants else set()) | set(also)) - {root}
    for pid in stopped:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _running(stopped):
        time.sleep(0.1)
    for pid in _running(stopped):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _running(stopped):
        time.sleep(0.05)
    _reap(stopped)
    return sorted(_running(stopped))


def _running(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _status(pid) not in (None, "Z", "X")}


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile
        os.kill(pid, signum)


def _reap(pids: set[int]) -> None:
    """Collect those of ``pids`` that are this process's exited children, so none stays a zombie meanwhile."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a grandchild: its parent or init collects it)
            continue
