"""The driver's clock: wall and CPU seconds per named phase of a run (``summary.json``'s ``timing``).

A phase ends when it is marked: everything since the previous mark (wall time and the driver's CPU time, all
its threads) is charged to it, so the phases add up to the run. Marking a name again adds to it. The first
phase runs from the clock's start in wall time, and from the process's start in CPU time (Python's start-up
and imports are the driver's cost too).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PhaseClock", "driver_cpu_s", "peak_rss_mb", "process_started_perf_s"]


def driver_cpu_s() -> float:
    """CPU seconds this process (the driver, all its threads) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: ``VmHWM`` of /proc/self/status, else ``ru_maxrss``.

    ``ru_maxrss`` survives ``execve``: a command started by a large process (a benchmark, a notebook) reports
    at least its launcher's memory at the fork, however small the command itself. ``VmHWM`` belongs to
    the process's own address space.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_started_perf_s() -> float:
    """When this process started, on the ``time.perf_counter()`` scale (Python's start and imports included).

    Linux: the process's start time from ``/proc/self/stat`` (clock ticks since boot, 10 ms resolution), turned
    into this clock through the boot time; elsewhere (or if /proc cannot be read) the time of this module's
    import, which misses only the interpreter's own start.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            # Field 22, counted after the command name's closing parenthesis (the name may hold spaces).
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as uptime:
            up_s = float(uptime.read().split()[0])
        age_s = up_s - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_PERF_S
    return time.perf_counter() - max(age_s, 0.0)


_IMPORTED_PERF_S = time.perf_counter()


class PhaseClock:
    """Wall and CPU seconds charged to named phases, in the order they were first marked."""

    def __init__(self, started_wall_s: float | None = None) -> None:
        self.started_wall_s = time.perf_counter() if started_wall_s is None else started_wall_s
        self._wall_mark = self.started_wall_s
        self._cpu_mark = 0.0
        self._wall_s: dict[str, float] = {}
        self._cpu_s: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """Charge the wall and CPU seconds since the previous mark to ``phase``."""
        wall, cpu = time.perf_counter(), driver_cpu_s()
        self._wall_s[phase] = self._wall_s.get(phase, 0.0) + wall - self._wall_mark
        self._cpu_s[phase] = self._cpu_s.get(phase, 0.0) + cpu - self._cpu_mark
        self._wall_mark, self._cpu_mark = wall, cpu

    def elapsed_s(self) -> float:
        """Wall seconds since the clock started (not a phase: nothing is charged)."""
        return time.perf_counter() - self.started_wall_s

    @property
    def wall_s(self) -> Mapping[str, float]:
        return MappingProxyType(self._wall_s)

    @property
    def cpu_s(self) -> Mapping[str, float]:
        return MappingProxyType(self._cpu_s)
