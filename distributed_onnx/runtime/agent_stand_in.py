"""A stand-in for one of the raylet's two agents, in a Ray started for one backtest and stopped after it.

The raylet starts two Python agents and registers with the GCS only once both have written their port files
(Ray's ``WaitForPersistedPort``): the dashboard agent (node metrics and logs for a dashboard) and the runtime-env
agent (it builds ``runtime_env``\\ s: pip, conda, a working directory). Each imports Ray and its web stack, which
on 2 cores took seconds of the start (``benchmarks/results/time_to_results.md``), and a backtest's private Ray
uses neither: it runs no dashboard, and its actors declare no ``runtime_env`` (the raylet only calls the agent
for a non-empty one). So :func:`~.ray_private.single_node_head` (asked with ``stand_in_agents``) has the raylet
start this script instead, twice: it writes the port files the agent would, each ``-1`` ("not in use", what
Ray's own minimal agent writes for the services it does not run), and then waits for the raylet, which
fate-shares with its agents, to go away.

The raylet it waits for is the parent it finds at its first moment, and only if that parent is a raylet: a raylet
killed while the stand-in was still starting (a backtest refused at once, ``--output`` in use, exits and its
Ray's processes go with it) left the stand-in with the init process (or a subreaper) as its parent, which it took
for the raylet and waited for forever, one orphan per agent. A stand-in whose parent is not a raylet exits at once.

Run as a file with ``python -S``: standard library only, so it starts in milliseconds. It never listens on a
socket. A Ray that has to build a ``runtime_env`` cannot run on it: the embedded Ray of the Python API and of
``serve``, which outlive one run or serve user code, keep Ray's own agents.
"""

from __future__ import annotations

import os
import sys
import time

#: Not in use: what Ray's own agent writes for a service it does not run.
NOT_IN_USE = -1
#: How often the stand-in checks that the raylet that started it is still there.
PARENT_POLL_S = 1.0
#: The raylet's process name (its executable's), what Linux's ``/proc/<pid>/comm`` says for it.
RAYLET_NAME = "raylet"


def is_a_raylet(pid: int) -> bool:
    """Whether ``pid`` is a raylet: by its name where ``/proc`` gives it (Linux), else whether it is not the init
    process (an orphan's parent where there is no subreaper)."""
    if pid <= 1:
        return False
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip() == RAYLET_NAME
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone (Linux), or no /proc: only the init process test above
    except OSError:
        return False


def options(argv: list[str]) -> dict[str, str]:
    """``--key=value`` arguments as a dict (the rest ignored).

    >>> options(["--session-dir=/tmp/s", "--node-id=ab", "--ports=a,b", "-x"])
    {'session-dir': '/tmp/s', 'node-id': 'ab', 'ports': 'a,b'}
    """
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)


def persist_port(session_dir: str, node_id: str, name: str, port: int) -> None:
    """Write ``port`` where the raylet reads it (``<session dir>/<name>_<node id>``), whole or not at all."""
    path = os.path.join(session_dir, f"{name}_{node_id}")
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as file:
        file.write(str(port))
    os.replace(partial, path)


def main(argv: list[str]) -> None:
    parent = os.getppid()  # first: the raylet may be gone by the next line
    if not is_a_raylet(parent):  # its raylet went before it started: nothing to wait for (module docstring)
        return
    given = options(argv)
    for name in filter(None, given["ports"].split(",")):
        persist_port(given["session-dir"], given["node-id"], name, NOT_IN_USE)
    while os.getppid() == parent:  # the raylet stops its agents itself; this covers a raylet that was killed
        time.sleep(PARENT_POLL_S)


if __name__ == "__main__":
    main(sys.argv[1:])
