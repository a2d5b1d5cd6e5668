"""Bad input tables exit 2 with one line naming the rows, before any actor or session starts (no Ray started).

The cases that used to escape as a TypeError, an uncaught ArrowInvalid or a multi-gigabyte allocation.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx import cli
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

STEP_US = 30 * 60 * 1_000_000
T0_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
N = 64


def _write(path: Path, series_id: list[str | None], stamps: pa.Array) -> Path:
    pq.write_table(pa.table({"series_id": pa.array(series_id, pa.string()), "timestamp": stamps, "y": [1.0] * N}), path)
    return path


def _grid_us() -> np.ndarray:
    return T0_US + np.arange(N, dtype=np.int64) * STEP_US


def null_series_id(path: Path) -> Path:
    ids: list[str | None] = ["a"] * N
    ids[5] = None
    return _write(path, ids, pa.array(_grid_us(), pa.timestamp("us", tz="UTC")))


def nanosecond_timestamp(path: Path) -> Path:
    stamps = _grid_us() * 1_000
    stamps[7] += 250
    return _write(path, ["a"] * N, pa.array(stamps, pa.timestamp("ns", tz="UTC")))


def stray_timestamp(path: Path) -> Path:
    stamps = _grid_us()
    stamps[0] = 0  # 1970-01-01: an epoch-zero parse
    return _write(path, ["a"] * N, pa.array(stamps, pa.timestamp("us", tz="UTC")))


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (null_series_id, "empty series_id at rows [5]"),
        (nanosecond_timestamp, "sub-microsecond parts at rows [7]"),
        (stray_timestamp, "between rows 0 (1970-01-01T00:00:00.000000Z) and 1"),
    ],
    ids=["null-series-id", "nanoseconds", "stray-timestamp"],
)
def test_bad_table_exits_2_with_one_line_naming_rows(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, make: object, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make(tmp_path / "bad.parquet")  # type: ignore[operator]
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data)]

    code = cli.main([*argv, "--output", str(tmp_path / "run")])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert needle in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def _processes_naming(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line names ``marker`` (the test's own Ray temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("entry", ["command", "run_backtest"])
def test_bad_data_on_a_fresh_output_stops_the_early_started_ray_and_leaves_no_process(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, entry: str
) -> None:
    """A fresh output folder starts Ray and the pool while the data is read: bad data must not start the pool,
    and no Ray process may outlive the run (the command leaves Ray to its exit; ``run_backtest`` stops it first)."""
    data = _write(
        tmp_path / "dup.parquet", ["a"] * N, pa.array(np.repeat(_grid_us()[: N // 2], 2), pa.timestamp("us", tz="UTC"))
    )
    # Every process of this run's Ray names its temp dir on its command line; short: Ray's socket paths under
    # it must fit AF_UNIX's 107 bytes.
    ray_temp = Path(tempfile.mkdtemp(prefix="dox-", dir="/tmp"))
    environment = {**os.environ, "RAY_TMPDIR": str(ray_temp)}
    output = tmp_path / "run"
    if entry == "command":
        argv = [sys.executable, "-m", "distributed_onnx", "backtest"]
        argv += ["--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), "--output", str(output)]
    else:
        script = (  # the driver's own function, which waits for the Ray it started to stop before it raises
            "import sys, ray\n"
            "from distributed_onnx.errors import DataError\n"
            "from distributed_onnx.evaluation.backtest import run_backtest\n"
            "from distributed_onnx.evaluation.settings import BacktestSettings\n"
            f"given = {{'checkpoint': [{str(tiny_checkpoint.weights_path)!r}], 'data': {str(data)!r},"
            f" 'output': {str(output)!r}}}\n"
            "try:\n"
            "    run_backtest(BacktestSettings.from_sources(given, source='test'))\n"
            "except DataError as exc:\n"
            "    print('error:', exc, file=sys.stderr)\n"
            "    sys.exit(0 if ray.is_initialized() else 2)\n"
        )
        argv = [sys.executable, "-c", script]

    finished = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=300, check=False)

    assert finished.returncode == 2, finished.stderr
    assert "duplicate (series_id, timestamp)" in finished.stderr
    if entry != "command":  # the command's plan no longer waits for the thread's import of Ray: its data error
        # may come before Ray's processes exist, which is what the early start must then leave behind (none)
        assert any(ray_temp.iterdir()), "no Ray session under the test's temp dir: the early start did not happen"
    left: list[int] = []
    for _ in range(300):  # Ray's processes die with the thread that started them: give the kernel a moment
        left = _processes_naming(str(ray_temp))
        if not left:
            break
        time.sleep(0.1)
    shutil.rmtree(ray_temp, ignore_errors=True)
    assert not left, f"Ray processes outlived the run: {left}"


@pytest.mark.integration  # tune builds the checkpoint's ORT session before it reads the data
def test_a_data_error_shows_no_file_byte_nor_any_value_of_the_locations_options(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PNG renamed ``.csv``: the CSV parser's complaint quoted its row, ESC and NUL included, into the error line
    (now the file is said not to be text, before any of its bytes are quoted);
    a store's ``endpoint_override`` was masked in the URL but shown again by the library's "Failed to connect to
    127.0.0.1:PORT". One line each, escaped, bounded, and no option value of the location anywhere."""
    png = tmp_path / "png.csv"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x1b[2J" + b"\x1b]0;x\x07," * 400 + b"a,b\nx\n")
    with socket.socket() as closed:  # a port nothing listens on (bound, never listened)
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        store = f"s3://K:S@bkt/x.csv?endpoint_override=http://127.0.0.1:{port}&scheme=http"
        lines = []
        # A file that is not a table is the data's fault (2); a store that does not answer, the environment's (3).
        for data, expected in ((str(png), 2), (store, 3)):
            words = ["tune", str(tiny_checkpoint.weights_path), "--data", data, "--output", str(tmp_path / "t")]
            code = cli.main(words)
            err = capsys.readouterr().err
            lines.append(err)
            assert code == expected, err
    bytes_line, store_line = lines
    # Said to be no text at all (attack I: a real PNG was an internal error), none of its bytes quoted
    assert "png.csv is not text (byte 0 is 0x89" in bytes_line and "IHDR" not in bytes_line, bytes_line
    assert "\x1b" not in bytes_line and "\x00" not in bytes_line and "\x07" not in bytes_line
    assert len(bytes_line) < 1_000, len(bytes_line)
    assert "endpoint_override=***" in store_line and f"127.0.0.1:{port}" not in store_line, store_line


@pytest.mark.integration  # an HTTP server on 127.0.0.1
def test_an_http_server_that_does_not_answer_is_exit_3_and_a_missing_file_on_one_that_does_is_exit_2(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """fsspec's HTTP filesystem raises "file not found" for a refused connection too (the connection error as its
    cause): ``--data https://...`` at a host that is down said "Data file not found" (exit 2, nothing to retry)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # its access log would share the command's stderr
            pass

        def send_head(self) -> Any:
            if "broken" in self.path:  # the server's own failure: not "no such file" either
                self.send_error(500)
                return None
            if "forbidden" in self.path:  # it answers, and refuses this client: not "no such file" (attack E)
                self.send_error(403)
                return None
            if "stream" in self.path:  # no size, no ranges: fsspec's stream failed at the first seek, exit 4
                self.send_response(200)
                self.end_headers()
                return io.BytesIO(b"PAR1 not a parquet file " * 8)
            return super().send_head()

    handler = functools.partial(Quiet, directory=str(tmp_path))
    answering = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    with socket.socket() as closed:  # a port nothing listens on (bound, never listened)
        closed.bind(("127.0.0.1", 0))
        silent = closed.getsockname()[1]
        try:
            seen = []
            for port, name in (
                (answering.server_address[1], "nowhere"),
                (silent, "nowhere"),
                (answering.server_address[1], "broken"),
                (answering.server_address[1], "forbidden"),
                (answering.server_address[1], "stream"),
            ):
                data = f"http://user:PASSWORD@127.0.0.1:{port}/{name}.parquet?sig=SIGNATURE"
                words = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", data]
                code = cli.main([*words, "--output", str(tmp_path / "run")])
                seen.append((code, capsys.readouterr().err))
        finally:
            answering.shutdown()
            answering.server_close()
    missing, down, failing, forbidden, stream = seen
    assert missing[0] == 2 and "Data file not found" in missing[1], missing
    for code, err in (down, failing):
        assert code == 3 and "does not answer" in err and "not found" not in err, (code, err)
    assert forbidden[0] == 3 and "the server refuses access (403" in forbidden[1], forbidden
    assert stream[0] == 2 and "by ranges: the server sends it only as a stream" in stream[1], stream
    for _, err in seen:
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "PASSWORD" not in err and "SIGNATURE" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.integration  # a listening socket on 127.0.0.1; tune builds the checkpoint's ORT session first
def test_an_http_server_that_accepts_and_never_answers_is_exit_3_after_the_wait_the_environment_sets(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server that accepts the connection and never sends a byte held ``--data http://...`` for fsspec's HEAD and
    then its GET, each under aiohttp's five minutes: the command waited ten. Each wait for the server is bounded
    (``DISTRIBUTED_ONNX_HTTP_READ_TIMEOUT_S``, here 1 s), and the end is the same line as a closed port's. The
    command is ``tune``, which reads the data as the backtest does but starts no Ray (a backtest here would start
    one in this process for a fresh output)."""
    import threading

    from distributed_onnx.storage_http import HTTP_READ_TIMEOUT_VARIABLE

    monkeypatch.setenv(HTTP_READ_TIMEOUT_VARIABLE, "1")
    with socket.socket() as silent:  # listening, never accepting: the kernel completes the handshake, nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        data = f"http://user:PASSWORD@127.0.0.1:{silent.getsockname()[1]}/d.parquet?sig=SIGNATURE"
        words = ["tune", str(tiny_checkpoint.weights_path), "--data", data, "--output", str(tmp_path / "tuned.json")]
        codes: list[int] = []
        command = threading.Thread(target=lambda: codes.append(cli.main(words)))
        started = time.monotonic()
        command.start()
        command.join(timeout=30)  # a watchdog only: without the bound the command waits ten minutes
        waited = time.monotonic() - started
    err = capsys.readouterr().err
    assert not command.is_alive() and codes == [3], (waited, codes, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "http://***@127.0.0.1:" in err and "/d.parquet?sig=***: the storage does not answer" in err, err
    assert f"nothing within 1 s, the wait {HTTP_READ_TIMEOUT_VARIABLE} sets" in err, err
    assert "PASSWORD" not in err and "SIGNATURE" not in err, err
    assert not (tmp_path / "tuned.json").exists()
