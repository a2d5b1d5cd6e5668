"""Ray lost under a running backtest: one ``error:`` line, exit 3, nothing of the run left, and a rerun resumes.

Before, killing the gcs_server of a ``ray start --head`` that a backtest had joined (``--address auto``, the head
started as docs/cluster.md says) gave a "Worker actor ... lost" warning, then a minute later only Ray's C++ "Failed
to connect to GCS within 60 seconds ... The program will terminate." and exit 1: no ``error:`` line (measured).
The embedded Ray had no watch either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from listening import process_tree
from ray_head import ray_head

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: Seconds the backtest may take from the kill to its exit (it sees the loss within a second; stopping takes a few).
EXIT_WITHIN_S = 20.0
#: Seconds the run's processes may take to be gone once the backtest exited (a SIGKILLed one is reaped by its parent).
REAPED_WITHIN_S = 1.0


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _running(pids: set[int]) -> set[int]:
    def state(pid: int) -> str | None:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None

    return {pid for pid in pids if state(pid) not in (None, "Z", "X")}


def _command(checkpoint: Path, output: Path, *flags: str) -> list[str]:
    """On the bundled data: 1500 windows in dozens of parts, a few seconds of work, still running at the kill."""
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", str(checkpoint)]
    command += ["--output", str(output), "--n-windows", "1500", "--stride", "1"]
    return [*command, "--rows-per-batch", "1", "--no-progress", *flags]


def _kill_mid_run(
    command: list[str], env: dict[str, str], output: Path, victim: object, ray_root: int | None = None
) -> tuple[int, str, set[int]]:
    """Start the backtest, kill ``victim(driver pid)`` once its first part is written; its exit code, stderr and the
    processes of the run (its own tree and its actors under ``ray_root``, read just before the kill)."""
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not list((output / "scores").glob("part-*.arrow")):
            assert process.poll() is None and time.monotonic() < deadline, "".join(stderr)
            time.sleep(0.05)
        ray_processes = process_tree(process.pid) | (process_tree(ray_root) if ray_root is not None else set())
        actors = {pid for pid in ray_processes if _name(pid) == "ray::WorkerActo"}
        assert actors, "no actor of the run found"
        run = (process_tree(process.pid) | actors) - {process.pid}
        pid = victim(process.pid)  # type: ignore[operator]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        process.wait(timeout=EXIT_WITHIN_S)
        took = time.monotonic() - killed_at
        reader.join(10)
        assert took < EXIT_WITHIN_S
        return process.returncode, "".join(stderr), run
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _assert_one_lost_line(code: int, stderr: str, killed: str, run: set[int]) -> None:
    assert code == 3, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Ray went away during the run" in errors[0] and f"{killed} (pid " in errors[0], errors[0]
    assert "Finished parts are kept" in errors[0] and "rerun the same command to resume" in errors[0], errors[0]
    assert "The program will terminate" not in stderr and "Traceback" not in stderr, stderr
    deadline = time.monotonic() + REAPED_WITHIN_S  # a SIGKILLed process is reaped by its parent
    while _running(run) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(run), f"processes of the run still running: {[(p, _name(p)) for p in _running(run)]}"


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_killed_gcs_of_a_joined_ray_ends_the_backtest_with_exit_3_and_a_rerun_resumes(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    command = _command(tiny_checkpoint.weights_path, output, "--address", "auto")
    with ray_head(loopback_only=True, as_documented=True, dashboard=False) as head:
        shell = {key: value for key, value in head.client_env().items() if not key.startswith("RAY_AUTH")}
        env = {**shell, "RAY_TMPDIR": str(head.ray_tmpdir), "HOME": os.environ["HOME"]}

        def head_gcs(_: int) -> int:
            (pid,) = [
                pid
                for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if _name(pid) == "gcs_server" and str(head.temp_dir) in Path(f"/proc/{pid}/cmdline").read_text("latin1")
            ]
            return pid

        code, stderr, run = _kill_mid_run(command, env, output, head_gcs, ray_root=head.pid)
    assert f"joined the Ray at {head.gcs_address}" in stderr
    _assert_one_lost_line(code, stderr, "gcs_server", run)
    assert not (output / "failed_windows.json").exists()
    kept = len(list((output / "scores").glob("part-*.arrow")))
    assert kept >= 1
    # The head is gone: the rerun's --address auto starts the embedded Ray and computes only the parts left.
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert rerun.returncode == 0, rerun.stderr
    windows = json.loads((output / "summary.json").read_text())["windows"]
    assert windows["done_before"] > 0 and windows["run_now"] == windows["planned"] - windows["done_before"], windows
    assert windows["failed"] == 0


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_killed_raylet_of_the_embedded_ray_ends_the_backtest_with_exit_3(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}

    def raylet(driver: int) -> int:
        (pid,) = [pid for pid in process_tree(driver) if _name(pid) == "raylet"]
        return pid

    code, stderr, run = _kill_mid_run(_command(tiny_checkpoint.weights_path, output), env, output, raylet)
    _assert_one_lost_line(code, stderr, "raylet", run)
