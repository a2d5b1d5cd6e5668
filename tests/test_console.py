"""What a user's console shows: our log lines, not Ray's own (its token notice, start-up lines) unless --verbose."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

# Ray's own console format (ray/_private/log.py): "<time>\tINFO worker.py:1234 -- message".
RAY_LINE = re.compile(r"\t(DEBUG|INFO|WARNING|ERROR) \S+\.py:\d+ -- ")


@pytest.fixture
def ray_logger_level(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RAY_SERVE_LOG_TO_STDERR", raising=False)  # restored (absent) after the test
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    loggers = [logging.getLogger(name) for name in ("ray", "ray.serve")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.usefixtures("ray_logger_level")
def test_quiet_ray_logging_hides_rays_warnings_and_verbose_shows_them() -> None:
    """Ray's and Serve's loggers drop their notices when quiet (whatever handlers Ray gave them), not errors."""
    from ray import serve  # noqa: F401  (sets up Serve's driver-side logger, as the serve command does)

    from distributed_onnx.runtime.local_ray import quiet_ray_logging

    records = _Records()
    ray_logger, serve_logger = logging.getLogger("ray"), logging.getLogger("ray.serve")
    ray_logger.addHandler(records)
    serve_logger.addHandler(records)  # Serve's logger does not propagate to "ray"
    from distributed_onnx.runtime import ray_private

    notice = ray_private.TOKEN_NOTICE.get()  # the logger of Ray's token-authentication notice
    try:
        quiet_ray_logging(quiet=True)
        notice.warning("Token authentication is enabled for this Ray cluster.")
        serve_logger.info('Started Serve in namespace "serve".')
        notice.error("a real Ray error")
        assert set(records.messages) == {"a real Ray error"}
        assert os.environ["RAY_SERVE_LOG_TO_STDERR"] == "0"  # Serve's actors log to their files
        assert os.environ["GRPC_VERBOSITY"] == "NONE"  # gRPC's C core of Ray's workers writes no raw lines

        quiet_ray_logging(quiet=False)
        notice.warning("Token authentication is enabled for this Ray cluster.")
        serve_logger.info('Started Serve in namespace "serve".')
        shown = set(records.messages) - {"a real Ray error"}  # a record may reach both handlers: sets
        assert shown == {"Token authentication is enabled for this Ray cluster.", 'Started Serve in namespace "serve".'}
    finally:
        ray_logger.removeHandler(records)
        serve_logger.removeHandler(records)


@pytest.mark.integration
def test_a_backtest_prints_none_of_rays_own_lines(tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(Path(__file__).parent))
    from backtest_data import write_dataset

    data = write_dataset(tmp_path / "load.parquet")
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    environment.pop("RAY_AUTH_MODE", None)  # Ray's default: it announces token authentication at start-up
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", str(tiny_checkpoint.weights_path)]
    command += ["--data", str(data), "--output", str(tmp_path / "run"), "--n-windows", "2", "--actors", "1"]
    command += ["--quantiles", "0.1,0.5,0.9", "--no-progress"]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240, check=False)

    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert not [line for line in lines if RAY_LINE.search(line) or "Token authentication" in line], done.stderr
    assert any("distributed_onnx.runtime.local_ray: Started an embedded local Ray" in line for line in lines)
