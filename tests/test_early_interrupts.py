"""Ctrl-C or SIGTERM while the command still imports its code and its dependencies (its first second or so on a
loaded node): the same one line and exit 130 as at any later moment, where it was Python's ``KeyboardInterrupt``
traceback, or for SIGTERM exit 143 and not a word (distributed_onnx/interrupts.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

ROOT = Path(__file__).resolve().parent.parent


def console_script() -> list[str]:
    """The console script as pip writes it from pyproject.toml's ``[project.scripts]`` (the one installed in a shared
    environment may be older than the checkout)."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["distributed-onnx"]
    module, function = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (the kernel's ``SigCgt`` mask): the console script's first act."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.integration  # a listening socket on 127.0.0.1, ONNX Runtime's import in the command
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_or_sigterm_while_the_command_imports_is_one_line_and_exit_130(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint
) -> None:
    """Each signal at three moments: as soon as the console script has set its handlers (the CLI's own import is
    next), and 0.3 s and 0.8 s later (the settings, onnxruntime and pyarrow's imports, or the data's read). The
    command is still running at each: its data is at a server that accepts and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        data = f"http://127.0.0.1:{silent.getsockname()[1]}/d.parquet"
        words = ["tune", str(tiny_checkpoint.weights_path), "--data", data, "--output", str(tmp_path / "tuned.json")]
        seen = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            for after_s in (0.0, 0.3, 0.8):
                process = subprocess.Popen(
                    [*console_script(), *words], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
                deadline = time.monotonic() + 3  # without the console script's handlers (before the fix): at 3 s
                while not catches_sigterm(process.pid) and time.monotonic() < deadline and process.poll() is None:
                    time.sleep(0.002)
                time.sleep(after_s)
                process.send_signal(signum)
                try:
                    _, stderr = process.communicate(timeout=30)
                finally:
                    process.kill()
                seen.append((signal.Signals(signum).name, after_s, process.returncode, stderr))
    for name, after_s, code, stderr in seen:
        words_of = "interrupted by SIGTERM" if name == "SIGTERM" else "interrupted"
        assert code == 130, (name, after_s, code, stderr)
        assert stderr.splitlines() == [f"error: {words_of}"] and "Traceback" not in stderr, (name, after_s, stderr)
    assert not (tmp_path / "tuned.json").exists()
