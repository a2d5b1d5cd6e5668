"""A real Ray head for tests, started with ``ray start --head`` on 127.0.0.1 and owned by the test alone.

Isolation, so the test neither depends on nor disturbs anyone else's Ray on the machine:

- its own ``--temp-dir`` (short: Ray's Unix socket paths must stay under ~107 bytes), which also holds the
  ``ray_current_cluster`` file, so a plain ``ray.init()`` elsewhere never finds this head (a client given
  ``RAY_TMPDIR=<its ray_tmpdir>`` finds it there, as a plain one finds the Ray ``ray start`` left running);
- with ``loopback_only``, Ray's multi-node switch off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), the command
  docs/cluster.md gives for a Ray that commands join: every socket on 127.0.0.1 (without it the head listens on
  all interfaces too);
- token authentication on (``RAY_AUTH_MODE=token``) with a fresh token in a file of its own
  (``RAY_AUTH_TOKEN_PATH``) and ``HOME`` pointed into the temp dir, so ``~/.ray/auth_token`` is neither read nor
  written;
- every fixed port chosen free by the OS (ephemeral range, outside Ray's worker ports 10002-19999), every
  address 127.0.0.1 (the dashboard included);
- with ``dashboard=False``, no dashboard (nor its job and state APIs): for a test that only joins the head, which
  then is up once ``ray start`` has recorded its address, without the seconds the dashboard takes to start;
- teardown never runs ``ray stop`` (it stops every Ray of the user): ``ray start --block`` runs in its own
  session, gets SIGTERM (it then stops the processes it started), and whatever survives is killed by pid:
  the members of that process group and the processes whose command line names this head's temp dir.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from conftest import free_ports

RAY = str(Path(sys.executable).with_name("ray"))
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RayHead:
    gcs_address: str
    dashboard_url: str  # "" for a head started without its dashboard
    temp_dir: Path
    env: dict[str, str]  # what a client of this head runs with: token auth on, this head's token
    pid: int
    ray_tmpdir: Path  # RAY_TMPDIR under which Ray's default temp dir is this head's (its address file there)

    def client_env(self, **overrides: str) -> dict[str, str]:
        return {**self.env, **overrides}


@contextmanager
def ray_head(
    num_cpus: int = 2,
    timeout_s: float = 90.0,
    *,
    loopback_only: bool = False,
    as_documented: bool = False,
    dashboard: bool = True,
) -> Iterator[RayHead]:
    root = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    temp_dir = root / "ray"  # Ray's default temp dir under RAY_TMPDIR=root
    temp_dir.mkdir()
    home = temp_dir / "home"
    home.mkdir()
    token_path = home / ".ray" / "auth_token" if as_documented else temp_dir / "auth_token"
    token_path.parent.mkdir(exist_ok=True)
    token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env["HOME"] = str(home)
    if not as_documented:
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)})
    # The switch for the head's processes only: a client (head.env) runs as a user's command does, without it.
    head_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"} if loopback_only else env
    gcs, dashboard_port, client, agent_http, agent_grpc, runtime_env, metrics = free_ports(7)
    shown = [f"--dashboard-host={LOOPBACK}", f"--dashboard-port={dashboard_port}"] if dashboard else []
    command = [
        RAY, "start", "--head", "--block", "--disable-usage-stats",
        f"--node-ip-address={LOOPBACK}", f"--include-dashboard={str(dashboard).lower()}", *shown,
        f"--port={gcs}", f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
        f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}", "--num-gpus=0",
    ]  # fmt: skip
    log = (temp_dir / "ray-start.log").open("wb")
    process = subprocess.Popen(command, env=head_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{LOOPBACK}:{dashboard_port}" if dashboard else ""
    head = RayHead(f"{LOOPBACK}:{gcs}", url, temp_dir, env, process.pid, root)
    try:
        _wait_for_jobs_api(head, process, timeout_s)
        yield head
    finally:
        _stop(process, temp_dir)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_jobs_api(head: RayHead, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until ``ray start`` has recorded the head's address (its last step) and the dashboard, if any, answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}: {_log_tail(head.temp_dir)}")
        if (head.temp_dir / "ray_current_cluster").is_file() and (not head.dashboard_url or _answers(head)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"Ray head not up after {timeout_s}s: {_log_tail(head.temp_dir)}")


def _answers(head: RayHead) -> bool:
    try:
        with urllib.request.urlopen(f"{head.dashboard_url}/api/version", timeout=2):
            return True
    except urllib.error.HTTPError:  # 401/403: up, and refusing a client without the token
        return True
    except OSError:
        return False


def _log_tail(temp_dir: Path) -> str:
    path = temp_dir / "ray-start.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _stop(process: subprocess.Popen[bytes], temp_dir: Path) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    deadline = time.monotonic() + 15
    while (pids := _own_processes(process.pid, str(temp_dir))) and time.monotonic() < deadline:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def _own_processes(session_id: int, marker: str) -> list[int]:
    """Live processes of this head: in the session of ``ray start`` or naming its temp dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                continue  # a zombie: already dead, waiting for its parent to reap it
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            session = os.getsid(int(entry.name))
        except (OSError, ProcessLookupError, IndexError):
            continue
        if session == session_id or marker in cmdline:
            found.append(int(entry.name))
    return found
