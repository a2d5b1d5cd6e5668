"""A backtest joins the Ray that ``ray start --head`` left running on 127.0.0.1, and leaves it as it found it.

The head is real (:mod:`ray_head`, started loopback-only as docs/cluster.md tells a user to start it, with its
address file where Ray's default temp dir would hold it); the commands run as a user runs them, in a
subprocess. The decision ``auto`` makes about a Ray that listens beyond loopback is pure logic, tested with fakes
of what /proc would show (the tests never bind beyond 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ray_head import RayHead, ray_head

from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.runtime import running_ray
from distributed_onnx.runtime.listening import listening_sockets

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: In a fresh interpreter: the command's own ``main`` on a finished run directory, then whether Ray was imported.
RERUN = (
    "import sys; from distributed_onnx.cli import main; code = main(sys.argv[1:]); "
    "print('RESULT', code, 'ray' in sys.modules)"
)


def _backtest(head: RayHead, checkpoint: Path, data: Path, output: Path, *flags: str) -> list[str]:
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", str(checkpoint)]
    command += ["--data", str(data), "--output", str(output), "--n-windows", "3", "--quantiles", "0.1,0.5,0.9"]
    return [*command, "--no-progress", *flags]


def _alive_worker_actors(head: RayHead) -> list[dict[str, object]]:
    """The head's worker actors not dead, from Ray's state API with the head's token: what ``ray list actors
    --detail`` prints, without starting the ``ray`` command (seconds of imports) for it."""
    token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    request = urllib.request.Request(
        f"{head.dashboard_url}/api/v0/actors?limit=10000&detail=true", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        listed = json.loads(answer.read())
    assert listed["result"] is True, listed
    actors: list[dict[str, object]] = listed["data"]["result"]["result"]
    assert actors, "the state API listed no actor at all: the runs' actors should show, dead"
    return [actor for actor in actors if actor.get("state") != "DEAD" and "WorkerActor" in str(actor.get("class_name"))]


@pytest.mark.integration
def test_a_backtest_joins_the_running_loopback_ray_and_leaves_it_up_and_clean(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    """``--address auto`` joins the Ray ``ray start`` recorded; its address given explicitly joins it too (before,
    Ray turned 127.0.0.1 into the machine's address, where this Ray does not listen, and the command hung); no
    address starts the command's own Ray beside it (before, Ray joined the recorded one and the command failed);
    each run's actors are gone afterwards and the Ray still runs; a rerun of a finished run imports no Ray."""
    sys.path.insert(0, str(Path(__file__).parent))
    from backtest_data import write_dataset

    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    with ray_head(loopback_only=True) as head:
        # The user's HOME (matplotlib's font cache there: the report process does not rebuild it); the token
        # comes from RAY_AUTH_TOKEN_PATH.
        env = head.client_env(RAY_TMPDIR=str(head.ray_tmpdir), HOME=os.environ["HOME"])
        # The command's own Ray (no address) runs beside the two joins: it neither uses nor waits on the head.
        with ThreadPoolExecutor(max_workers=1) as beside:
            own_run = beside.submit(
                subprocess.run,  # no address: the command's own Ray, though Ray's default temp dir records this one
                _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "own"),
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            joined = subprocess.run(
                _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "auto", "--address", "auto"),
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            named = subprocess.run(  # without the switch in the client's environment, as a user's shell has it
                _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "named", "--address", head.gcs_address),
                env=head.client_env(HOME=os.environ["HOME"]),
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            own = own_run.result()
        assert joined.returncode == 0, joined.stderr
        assert f"--address auto: joined the Ray at {head.gcs_address}" in joined.stderr
        assert "Started an embedded local Ray" not in joined.stderr
        assert named.returncode == 0, named.stderr
        assert "Started an embedded local Ray" not in named.stderr
        assert own.returncode == 0, own.stderr  # before: exit 4, Ray joined this head and refused num_cpus for it
        assert "Started an embedded local Ray" in own.stderr

        assert _alive_worker_actors(head) == []
        port = int(head.gcs_address.rsplit(":", 1)[1])
        assert any(address.endswith(f":{port}") for address, _ in listening_sockets()), "the head was stopped"

        finished = _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "auto", "--address", "auto")
        command = [sys.executable, "-c", RERUN, *finished[3:]]
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
        assert rerun.returncode == 0, rerun.stderr
        assert "RESULT 0 False" in rerun.stdout, rerun.stdout + rerun.stderr  # exit 0, Ray never imported
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["windows"]["run_now"] == 0 and summary["windows"]["done_before"] > 0
    assert summary["timing"]["report_drawn_by"] == "report process"  # started at once: nothing to compute


# ------------------------------------------------------------------------------------------ what auto refuses


def _fake_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, recorded: str | None, listening: list[str], readable: bool = True
) -> None:
    """A machine where ``ray start`` recorded ``recorded`` and its processes listen on ``listening``."""
    address_file = tmp_path / "ray_current_cluster"
    if recorded is not None:
        address_file.write_text(recorded)
    monkeypatch.setattr(running_ray.ray_private, "check_names", lambda names: None)
    monkeypatch.setattr(
        running_ray.ray_private, "RAY_ADDRESS_FILE", _Name(lambda temp_dir: str(address_file)), raising=True
    )
    monkeypatch.setattr(running_ray, "_listener", lambda port: 4242 if listening else None)
    monkeypatch.setattr(running_ray, "_session_name", lambda pid: "session_x")
    monkeypatch.setattr(running_ray, "_session_processes", lambda session: {4242, 4243})
    monkeypatch.setattr(running_ray, "_readable", lambda pid: readable)
    monkeypatch.setattr(running_ray, "processes_listening_addresses", lambda pids: listening)
    monkeypatch.setattr(running_ray, "_environment", lambda pid: {"RAY_AUTH_MODE": "token", "HOME": "/home/u"})


class _Name:
    def __init__(self, value: object) -> None:
        self.value = value

    def get(self) -> object:
        return self.value


def test_auto_joins_only_a_running_ray_that_listens_on_loopback_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from distributed_onnx.runtime.ray_auth import RayAuth

    _fake_machine(monkeypatch, tmp_path, "127.0.0.1:6379", ["127.0.0.1:6379", "::ffff:127.0.0.1:8265"])
    assert running_ray.find_local_ray() == running_ray.LocalRay(
        "127.0.0.1:6379",
        "the Ray at 127.0.0.1:6379 (started by `ray start`, loopback only)",  # "joined" is said once joined
        auth=RayAuth("token", "/home/u/.ray/auth_token"),  # what its GCS runs with: ray start's token file
    )

    _fake_machine(monkeypatch, tmp_path, "127.0.0.1:6379", ["0.0.0.0:6379", "127.0.0.1:8265"])
    exposed = running_ray.find_local_ray()
    assert exposed.address is None and exposed.refused
    assert "listens beyond loopback (0.0.0.0:6379)" in exposed.reason
    assert "--address 127.0.0.1:6379" in exposed.reason  # naming it joins it anyway

    _fake_machine(monkeypatch, tmp_path, "10.1.2.3:6379", ["10.1.2.3:6379"])
    remote = running_ray.find_local_ray()
    assert remote.address is None and remote.refused and "not on 127.0.0.1" in remote.reason

    _fake_machine(monkeypatch, tmp_path, "127.0.0.1:6379", ["127.0.0.1:6379"], readable=False)
    other_user = running_ray.find_local_ray()
    assert other_user.address is None and other_user.refused and "another user" in other_user.reason

    _fake_machine(monkeypatch, tmp_path, "127.0.0.1:6379", [])
    stopped = running_ray.find_local_ray()
    assert stopped.address is None and not stopped.refused and "not running" in stopped.reason

    (tmp_path / "ray_current_cluster").unlink()
    _fake_machine(monkeypatch, tmp_path, None, [])
    none = running_ray.find_local_ray()
    assert none.address is None and not none.refused and "no Ray started by `ray start`" in none.reason


def test_the_backtests_driver_modules_import_no_ray() -> None:
    """The command imports the early start and the driver before its thread imports Ray (``early_start.py``):
    Ray's import then overlaps the driver's own, and a rerun with nothing to compute never loads it."""
    script = (
        "import sys; import distributed_onnx.cli, distributed_onnx.evaluation.driver.early, "
        "distributed_onnx.evaluation.driver.run; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.integration
def test_auto_joins_a_ray_started_as_the_docs_say_and_a_refused_token_is_one_line(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    """A head started as docs/cluster.md says (no RAY_AUTH_MODE: ``ray start`` turns token mode on by itself for
    the token in its ~/.ray/auth_token), joined from a shell without RAY_AUTH_MODE. Before: the client ran with
    authentication off, logged "joined" before connecting, then twenty seconds of Ray's InvalidAuthToken lines
    and an I/O error (exit 3); a wrong token the same. Now the join works, and a wrong token is one line naming
    authentication and what to set, without Ray's retries."""
    sys.path.insert(0, str(Path(__file__).parent))
    from backtest_data import write_dataset

    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    with ray_head(loopback_only=True, as_documented=True, dashboard=False) as head:
        shell = {key: value for key, value in head.client_env().items() if not key.startswith("RAY_AUTH")}
        env = {**shell, "RAY_TMPDIR": str(head.ray_tmpdir), "HOME": os.environ["HOME"]}  # not the head's HOME
        joined = subprocess.run(
            _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "auto", "--address", "auto"),
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert joined.returncode == 0, joined.stderr
        assert f"--address auto: joined the Ray at {head.gcs_address}" in joined.stderr
        assert "InvalidAuthToken" not in joined.stderr and "Started an embedded local Ray" not in joined.stderr

        wrong = tmp_path / "wrong_token"
        wrong.write_text("0" * 64)
        refused = subprocess.run(
            _backtest(head, tiny_checkpoint.weights_path, data, tmp_path / "refused", "--address", "auto"),
            env={**env, "RAY_AUTH_TOKEN_PATH": str(wrong)},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert refused.returncode == 3, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "authentication to the Ray at" in errors[0], refused.stderr
    assert f"RAY_AUTH_TOKEN_PATH={wrong}" not in errors[0] and "RAY_AUTH_TOKEN_PATH" in errors[0]
    assert "InvalidAuthToken" not in refused.stderr and "joined" not in refused.stderr, refused.stderr
    # Refused before Ray's own join: none of its GCS client's retry lines (about 20 of them, 21 s, before the fix).
    assert "gcs_client" not in refused.stderr and "Failed to connect to Ray cluster" not in refused.stderr


@pytest.mark.integration
def test_auto_falls_back_on_an_address_file_that_is_not_text_and_ctrl_c_says_what_to_do(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    """An address file of bytes that are not text crashed ``--address auto`` (exit 4, UnicodeDecodeError): it
    starts the embedded Ray and says why. Ctrl-C on the backtest then printed ``error: `` alone: it says to rerun."""
    sys.path.insert(0, str(Path(__file__).parent))
    from backtest_data import write_dataset

    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths stay under 107 bytes
    (ray_tmpdir / "ray").mkdir()
    (ray_tmpdir / "ray" / "ray_current_cluster").write_bytes(b"garbage\x00\xff")
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", str(tiny_checkpoint.weights_path)]
    command += ["--data", str(data), "--output", str(tmp_path / "run"), "--n-windows", "3000", "--stride", "1"]
    command += ["--rows-per-batch", "1", "--no-progress", "--address", "auto"]
    process = subprocess.Popen(command, env={**env, "RAY_TMPDIR": str(ray_tmpdir)}, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        seen.append(line)
        if "Started an embedded local Ray" in line:
            break
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    shutil.rmtree(ray_tmpdir, ignore_errors=True)
    stderr = "".join(seen) + rest
    assert process.returncode == 130, stderr
    assert "is not text: not an address `ray start` writes" in stderr
    assert "error: interrupted; rerun the same command to resume" in stderr.splitlines(), stderr


def test_each_unusable_address_file_has_its_own_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The lines ``--address auto`` logs before it starts the embedded Ray (real files; no Ray runs on port 1).
    Before: an empty file was "at , not on 127.0.0.1; pass --address  to join it anyway", ``0.0.0.0:1`` for a Ray
    not running suggested joining it, a directory was "not found", bytes that are not text crashed."""

    def reason(content: bytes | None, directory: bool = False) -> running_ray.LocalRay:
        address_file = tmp_path / "ray_current_cluster"
        if address_file.is_dir():
            address_file.rmdir()
        elif address_file.exists():
            address_file.unlink()
        if directory:
            address_file.mkdir()
        elif content is not None:
            address_file.write_bytes(content)
        monkeypatch.setattr(running_ray.ray_private, "RAY_ADDRESS_FILE", _Name(lambda temp_dir: str(address_file)))
        found = running_ray.find_local_ray()
        assert found.address is None and not found.refused, found
        return found

    assert "is empty: no Ray address recorded" in reason(b"  \n").reason
    assert "is not text" in reason(b"garbage\x00\xff").reason
    assert "a directory, not a file" in reason(None, directory=True).reason
    assert "not the host:port address" in reason(b"nonsense").reason
    dead = reason(b"0.0.0.0:1").reason
    assert "(0.0.0.0:1) is not running on this machine (nothing listens on port 1)" in dead
    assert "not found" in reason(None).reason


def test_auto_looks_where_ray_start_records_its_address_with_or_without_temp_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Outside test: a Ray started with ``RAY_TMPDIR=D ray start --temp-dir D`` records ``D/ray_current_cluster``;
    ``--address auto`` looked for ``D/ray/ray_current_cluster`` only and said "no Ray started by ray start on this
    machine" (false). Ray's real address-file function, on real files (no Ray runs on port 1)."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    missing = running_ray.find_local_ray()
    assert missing.address is None and not missing.refused
    own, beside = tmp_path / "ray" / "ray_current_cluster", tmp_path / "ray_current_cluster"
    assert f"({own} or {beside} not found; a Ray whose temp directory is elsewhere" in missing.reason, missing.reason
    for place in (beside, own):  # --temp-dir D; none (Ray's own place, looked first)
        place.parent.mkdir(exist_ok=True)
        place.write_text(f"127.0.0.1:{1 if place == beside else 2}")
        found = running_ray.find_local_ray()
        assert f"the Ray recorded in {place} ({place.read_text()}) is not running" in found.reason, found.reason
