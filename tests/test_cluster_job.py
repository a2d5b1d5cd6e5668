"""``ray job submit`` of ``jobs/backtest.py`` against a real head on 127.0.0.1, with token authentication on.

The head is started by :mod:`ray_head` (own temp dir, own token, free ports, loopback only). The job writes its
run directory through a ``file://`` URL, and its forecasts and metrics must equal a local run of the same
settings. A client without the cluster's token is refused; a job with bad input fails with the error in its log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from backtest_data import read_forecasts
from ray_head import RAY, RayHead, ray_head

from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
# What `--working-dir .` must not upload (the job only needs jobs/ and distributed_onnx/).
RUNTIME_ENV = {"excludes": [".venv", ".git", "runs", "benchmarks", "*.egg-info", "**/__pycache__", ".*_cache"]}


def write_series(path: Path, n_series: int = 3, n_points: int = 240) -> Path:
    rng = np.random.default_rng(7)
    start = np.datetime64("2024-01-01T00:00", "us")
    step = np.timedelta64(30, "m")
    t = np.arange(n_points)
    table = pa.table(
        {
            "series_id": pa.array(np.repeat([f"s{k}" for k in range(n_series)], n_points)),
            "timestamp": pa.array(np.tile(start + t * step, n_series)).cast(pa.timestamp("us", tz="UTC")),
            "y": pa.array(
                np.concatenate(
                    [10 * k + np.sin(2 * np.pi * t / 48) + rng.normal(0, 0.1, n_points) for k in range(n_series)]
                )
            ),
        }
    )
    pq.write_table(table, path)
    return path


def write_config(path: Path, checkpoint: ResolvedCheckpoint, data: Path, output: str) -> Path:
    settings = {
        "checkpoint": str(checkpoint.weights_path),
        "data": str(data),
        "output": output,
        "n_windows": 12,
        "stride": 3,
        "quantiles": [0.1, 0.5, 0.9],
        "rows_per_batch": 8,
        "actors": 2,
        "cpus_per_actor": 0.5,
        "progress": False,
    }
    path.write_text(yaml.safe_dump(settings))
    return path


def submit(head: RayHead, config: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[str, str, int]:
    """``ray job submit`` (waits for the job, tails its log); returns (submission id, output, exit code)."""
    submission_id = f"backtest-{uuid.uuid4().hex[:8]}"
    command = [
        RAY, "job", "submit", "--address", head.dashboard_url, "--submission-id", submission_id,
        "--working-dir", str(REPO), "--runtime-env-json", json.dumps(RUNTIME_ENV),
        "--", sys.executable, "jobs/backtest.py", "--config", str(config), *flags,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env or head.env, cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )
    return submission_id, done.stdout + done.stderr, done.returncode


def job_status(head: RayHead, submission_id: str) -> str:
    """The job's status as Ray's job API reports it (``SUCCEEDED``, ``FAILED``, ...), read with this head's token:
    what ``ray job status`` prints, without starting the ``ray`` command (seconds of imports) for it."""
    token = Path(head.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    request = urllib.request.Request(
        f"{head.dashboard_url}/api/jobs/{submission_id}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return str(json.loads(answer.read())["status"])


@pytest.mark.timeout(420)
def test_submitted_backtest_equals_a_local_run(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path, ray_session: None
) -> None:
    data = write_series(tmp_path / "series.parquet")
    job_dir = tmp_path / "job-run"
    config = write_config(tmp_path / "backtest.yaml", tiny_checkpoint, data, job_dir.as_uri())

    with ray_head() as head, ThreadPoolExecutor(max_workers=3) as beside:
        # The refused client and the job with bad input run beside the good job: each is a process of its own, and
        # the bad job stops at its data, before it asks the head for any actor. The local run, in this process on
        # the session's Ray, runs while the good job runs on the head.
        refusing = beside.submit(
            subprocess.run,
            [RAY, "job", "list", "--address", head.dashboard_url],
            env=head.client_env(RAY_AUTH_TOKEN="0" * 64),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        failing = beside.submit(submit, head, config, "--data", str(tmp_path / "missing.parquet"))
        good = beside.submit(submit, head, config)
        local = run_backtest(BacktestSettings.from_sources({"output": str(tmp_path / "local-run")}, config))
        submission_id, log, code = good.result()

        # Token authentication is on: a client without this cluster's token is refused...
        refused = refusing.result()
        assert refused.returncode != 0
        assert "AuthenticationError" in refused.stdout + refused.stderr

        # ...and one with it (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH) submits and runs the job.
        assert code == 0, log
        assert job_status(head, submission_id) == "SUCCEEDED", log

        # Bad input: the job fails, with the error in its log (exit code 2 like the CLI).
        failed_id, failed_log, _ = failing.result()
        assert job_status(head, failed_id) == "FAILED", failed_log
        assert "Data file not found" in failed_log

    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["windows"]["run_now"] == local.summary["windows"]["planned"] == 36
    assert len(summary["actors"]) == 2
    assert read_forecasts(job_dir).equals(read_forecasts(tmp_path / "local-run"))
    assert pq.read_table(job_dir / "metrics.parquet").equals(local.read_metrics())
