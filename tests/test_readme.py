"""The README's commands paste (issue 28): every ```sh and ```python block runs, in order, from the repository root.

It reads whatever blocks README.md has (it is rewritten often): each ``sh`` block runs as one ``bash -e``
script with ``.venv/bin`` first on PATH, each ``python`` block with ``.venv/bin/python``; each must exit 0,
and the commands it knows print what they should (:data:`EXPECTED`). Blocks tagged otherwise (``bash``,
``text``, ``json``) are illustrations and are not run. Left out, and said so: the commands that would run the test
suite itself or need the network (:data:`NOT_RUN`), and opening a browser. Whatever a block starts in the
background is stopped when it ends (each runs in a process group of its own). Bounded: a block gets
:data:`BLOCK_TIMEOUT_S`, and serve listens on free ports (``DISTRIBUTED_ONNX_PORT``/``_GRPC_PORT``), not on a
port another job of this machine may hold.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK_TIMEOUT_S = 600
#: Commands not run here: the suite itself (this test is in it), the network, a browser, benchmarks.
NOT_RUN = re.compile(
    r"^\s*(make\s+(test|test-unit|check|check-install|lint|lint-imports|typecheck|bench-\S+|clean)\b"
    r"|\.ci/run|(\S*/)?pytest\b|xdg-open\b|open\s|ray\s+(up|down|job|submit|attach)\b)"
)
#: A command's output that shows it did its job: (the command, matched in a block, and text its output holds).
EXPECTED = [
    (re.compile(r"\bmake\s+backtest\b"), "wrote runs/reference/"),
    (re.compile(r"\bmake\s+live-demo\b"), "flagged_against_the_backtest"),
    (re.compile(r"distributed-onnx\s+backtest\b"), "wrote "),
    (re.compile(r"distributed-onnx\s+score\b"), "wrote "),
    (re.compile(r"distributed-onnx\s+--version\b"), "distributed-onnx "),
    (re.compile(r"replay_requests\.py\b"), "sent "),
]


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block tagged ``sh`` or ``python``, in order."""
    return [
        (match.group(1), match.group(2))
        for match in re.finditer(r"^```(sh|python)[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    ]


def runnable(code: str) -> tuple[str, list[str]]:
    """The block with the commands of :data:`NOT_RUN` replaced by ``:`` (continued lines joined), and those left out."""
    joined = re.sub(r"\\\n", " ", code)
    kept, left_out = [], []
    for line in joined.splitlines():
        if NOT_RUN.match(line):
            left_out.append(line.strip())
            kept.append(":")
        else:
            kept.append(line)
    return "\n".join(kept) + "\n", left_out


def _run(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a process group of its own; once it exits, stop what it left in the background.

    The output goes to a file, not a pipe: a ``serve ... &`` of the block inherits it and would hold a pipe open
    until it is stopped, so waiting for the pipe's end would wait for the server.
    """
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            process.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop_group(process.pid)
            log.seek(0)
            pytest.fail(f"{command} ran past {BLOCK_TIMEOUT_S} s; its output ends:\n{log.read()[-3000:]}")
        _stop_group(process.pid)  # what the block left in the background (a `serve ... &`) ends with it
        log.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, log.read())


def _stop_group(group: int, grace_s: float = 30.0) -> None:
    """SIGTERM the process group (serve stops cleanly on it), then SIGKILL what is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def test_the_readme_blocks_are_found() -> None:
    blocks = readme_blocks("x\n```sh\nmake backtest\n```\n```bash\nnot run\n```\n```python\nprint(1)\n```\n")
    assert blocks == [("sh", "make backtest\n"), ("python", "print(1)\n")]
    assert runnable("make test   # suite\nmake backtest \\\n  --x\nxdg-open a\n") == (
        ":\nmake backtest    --x\n:\n",
        ["make test   # suite", "xdg-open a"],
    )


@pytest.mark.integration
def test_every_sh_and_python_block_of_the_readme_runs_as_written() -> None:
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    assert any(language == "sh" for language, _ in blocks), "README.md has no ```sh block to run"
    environment = dict(os.environ)
    environment["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
    environment["DISTRIBUTED_ONNX_PORT"] = str(free_port())
    environment["DISTRIBUTED_ONNX_GRPC_PORT"] = str(free_port())
    environment.pop("VIRTUAL_ENV", None)
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
    for index, (language, code) in enumerate(blocks):
        if language == "sh":
            script, left_out = runnable(code)
            done = _run(["bash", "-e", "-o", "pipefail", "-c", script], environment)
        else:
            left_out = []
            done = _run([python, "-c", code], environment)
        where = f"README block {index + 1} ({language}):\n{code}\n(left out: {left_out})\noutput ends:\n"
        assert done.returncode == 0, where + done.stdout[-4000:]
        for command, text in EXPECTED:
            if language == "sh" and command.search(script):
                assert text in done.stdout, where + f"expected {text!r}\n" + done.stdout[-4000:]
