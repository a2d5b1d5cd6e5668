"""CPU seconds of a process tree, by role, over time: the command, Ray's own processes, the actors, and the rest.

A run of the command is several processes (the driver, GCS, the raylet and its agents, the log monitor, the
worker actors). To see where two cores go while it runs, a thread reads ``/proc/<pid>/stat`` of every
descendant of the measured process every ``interval_s`` and ``/proc/stat`` for the whole machine: what the
machine spent outside the tree is the other sessions' load, measured rather than guessed from the load average.
Linux only; a process that exits between two samples loses at most one interval of its CPU.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

#: Roles by a fragment of the program and its first argument (not the rest: the raylet's arguments name the
#: worker's script), first match wins; Ray retitles its Python processes ``ray::<name>``.
ROLES = (
    ("ray::WorkerActor", "actor"),
    ("ray::DashboardAgent", "dashboard_agent"),
    ("ray::RuntimeEnvAgent", "runtime_env_agent"),
    ("ray::IDLE", "ray_idle_worker"),
    ("ray::", "ray_worker_other"),
    ("default_worker.py", "ray_idle_worker"),
    ("gcs_server", "gcs_server"),
    ("raylet", "raylet"),
    ("log_monitor.py", "log_monitor"),
    ("dashboard/agent.py", "dashboard_agent"),
    ("runtime_env/agent", "runtime_env_agent"),
)


def _stat(pid: str) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds)`` of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
        command = b" ".join(arguments).decode(errors="replace")
    except OSError:
        return "other"
    for fragment, role in ROLES:
        if fragment in command:
            return f"{role}:{pid}" if role == "actor" else role
    return "other"


def machine_cpu_s() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot (every core)."""
    values = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) * TICK_S, sum(values[:8]) * TICK_S


class ProcessTreeCpu:
    """Samples a process tree's CPU by role until :meth:`stop`; :meth:`result` gives totals and a time line."""

    def __init__(self, root_pid: int, interval_s: float = 0.5) -> None:
        self._root = root_pid
        self._interval_s = interval_s
        self._cpu: dict[int, float] = {}  # pid -> last CPU seconds seen
        self._roles: dict[int, str] = {}
        self._timeline: list[dict[str, Any]] = []
        self._started = time.perf_counter()
        self._machine_start = machine_cpu_s()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        parents: dict[int, list[int]] = {}
        seen: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = _stat(entry)
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(entry))
                seen[int(entry)] = stat[1]
        tree, stack = [], [self._root]
        while stack:
            pid = stack.pop()
            if pid in seen:
                tree.append(pid)
                stack.extend(parents.get(pid, []))
        for pid in tree:
            if pid not in self._roles or self._roles[pid] in ("other", "ray_idle_worker", "ray_worker_other"):
                self._roles[pid] = _role(pid, self._root)  # a worker becomes an actor once it is assigned
            self._cpu[pid] = seen[pid]
        busy, _ = machine_cpu_s()
        self._timeline.append(
            {
                "t_s": round(time.perf_counter() - self._started, 3),
                "machine_busy_s": round(busy - self._machine_start[0], 3),
                "by_role_s": {role: round(value, 3) for role, value in self._by_role().items()},
            }
        )

    def _by_role(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for pid, cpu in self._cpu.items():
            role = self._roles.get(pid, "other")
            totals[role] = totals.get(role, 0.0) + cpu
        return totals

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, Any]:
        """Totals by role, the tree's and the machine's CPU, and the time line of cumulative CPU by role."""
        by_role = self._by_role()
        tree_s = sum(by_role.values())
        machine = self._timeline[-1]["machine_busy_s"] if self._timeline else None
        return {
            "cpu_s_by_role": {role: round(value, 2) for role, value in sorted(by_role.items())},
            "tree_cpu_s": round(tree_s, 2),
            "machine_busy_cpu_s": machine,
            "outside_tree_cpu_s": None if machine is None else round(machine - tree_s, 2),
            "timeline": self._timeline,
        }


def between(timeline: list[dict[str, Any]], start_s: float, stop_s: float) -> dict[str, Any]:
    """CPU seconds by role (and the machine's) spent between two times of a time line (nearest samples)."""
    if not timeline:
        return {}

    def nearest(t: float) -> dict[str, Any]:
        return min(timeline, key=lambda sample: abs(sample["t_s"] - t))

    first, last = nearest(start_s), nearest(stop_s)
    roles = set(first["by_role_s"]) | set(last["by_role_s"])
    spent = {role: round(last["by_role_s"].get(role, 0.0) - first["by_role_s"].get(role, 0.0), 2) for role in roles}
    return {
        "from_s": first["t_s"],
        "to_s": last["t_s"],
        "cpu_s_by_role": dict(sorted(spent.items())),
        "machine_busy_cpu_s": round(last["machine_busy_s"] - first["machine_busy_s"], 2),
        "outside_tree_cpu_s": round(last["machine_busy_s"] - first["machine_busy_s"] - sum(spent.values()), 2),
    }


def actors_between(timeline: list[dict[str, Any]], start_s: float, stop_s: float) -> dict[str, Any]:
    """Each actor's CPU share of ``[start_s, stop_s]`` and how long before ``stop_s`` it last worked (its idle tail).

    "Worked" is a sample interval in which the actor used at least a tenth of the interval's CPU (an idle actor
    uses none; a busy one on a loaded machine may get a third).
    """
    samples = [sample for sample in timeline if start_s <= sample["t_s"] <= stop_s]
    if len(samples) < 2:
        return {}
    actors = sorted({role for sample in samples for role in sample["by_role_s"] if role.startswith("actor:")})
    result = {}
    for actor in actors:
        cpu = [sample["by_role_s"].get(actor, 0.0) for sample in samples]
        last_busy = samples[0]["t_s"]
        for before, after, sample, previous in zip(cpu, cpu[1:], samples[1:], samples, strict=False):
            if after - before >= 0.1 * (sample["t_s"] - previous["t_s"]):
                last_busy = sample["t_s"]
        span = samples[-1]["t_s"] - samples[0]["t_s"]
        result[actor] = {
            "cpu_s": round(cpu[-1] - cpu[0], 2),
            "cpu_share": round((cpu[-1] - cpu[0]) / span, 3) if span > 0 else None,
            "idle_tail_s": round(samples[-1]["t_s"] - last_busy, 2),
        }
    return result
