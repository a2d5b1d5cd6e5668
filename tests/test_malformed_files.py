"""Issue 40 (a standing adversarial suite): a corpus of malformed files fed to every command that reads one.

``backtest --data``, ``backtest --covariate-data``, ``score --actuals`` and ``export --data`` each get every file
of the corpus (empty, zero-byte Parquet, CSV of garbage, a binary blob, Parquet of a foreign schema, JSON of
another shape, a truncated Parquet, a folder where a file is expected, wrong column types, all-null rows). Each
must end in exit 2 (the user's file) or 3 (real I/O) with exactly one ``error:`` line naming the file: never a
traceback, never exit 4. Every command runs in-process (``cli.main``); none gets as far as starting Ray (the
backtest is pointed at an address nothing answers, which it would only reach after reading its data).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx import cli
from distributed_onnx.resources import REFERENCE_DATASET

_TS = pa.timestamp("us", "UTC")


def _bytes(content: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content)


def _table(table: pa.Table) -> Callable[[Path], None]:
    return lambda path: pq.write_table(table, path)


def _truncated(path: Path) -> None:
    whole = Path(REFERENCE_DATASET).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


def _folder(path: Path) -> None:
    path.mkdir()
    pq.write_table(pa.table({"x": [1]}), path / "inside.parquet")


#: name -> (file name, how to write it). The seeded blob is the same bytes every run.
CORPUS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "empty-csv": ("empty.csv", _bytes(b"")),
    "zero-byte-parquet": ("zero.parquet", _bytes(b"")),
    "garbage-csv": ("garbage.csv", _bytes(b'\x00\xff,,"unterminated\nrow,1,2,3,4\n;;;\n')),
    "binary-blob-parquet": ("blob.parquet", _bytes(np.random.default_rng(0).bytes(400))),
    "binary-blob-csv": ("blob.csv", _bytes(np.random.default_rng(1).bytes(400))),
    "json-named-parquet": ("shape.parquet", _bytes(json.dumps({"series": [1, 2]}).encode())),
    "json-named-csv": ("shape.csv", _bytes(json.dumps([{"a": 1}, {"b": [2]}]).encode())),
    "foreign-schema": ("foreign.parquet", _table(pa.table({"colour": ["red"], "n": [1]}))),
    "truncated-parquet": ("truncated.parquet", _truncated),
    "folder": ("folder.parquet", _folder),
    "header-only-csv": ("header.csv", _bytes(b"series_id,timestamp,y\n")),
    "text-timestamps": ("text.csv", _bytes(b"series_id,timestamp,y,available_at,temperature\na,notatime,x,no,hot\n")),
    "text-values": (
        "text.parquet",
        _table(pa.table({"series_id": ["a"], "timestamp": pa.array([0], _TS), "y": ["hot"], "temperature": ["x"]})),
    ),
    "all-null": (
        "nulls.parquet",
        _table(
            pa.table(
                {
                    "series_id": pa.array([None], pa.string()),
                    "timestamp": pa.array([None], _TS),
                    "y": pa.array([None], pa.float64()),
                }
            )
        ),
    ),
}


def _backtest(tmp_path: Path, data: Path, *extra: str) -> list[str]:
    arguments = ["backtest", "--data", str(data), "--output", str(tmp_path / "out"), "--n-windows", "2"]
    return [*arguments, "--no-progress", "--actors", "1", "--address", "127.0.0.1:1", *extra]


@pytest.fixture(scope="module")
def forecast_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real forecast log of one window, for ``score --actuals``."""
    from test_live_score import REQUEST_TIME_US, STEP_MIN, _item

    from distributed_onnx.live.log.writer import ForecastLog

    root = tmp_path_factory.mktemp("log") / "log"
    log = ForecastLog(root, flush_interval_s=60.0)
    assert log.submit(_item("r1", "a", REQUEST_TIME_US + 60 * STEP_MIN * 60_000_000))
    log.close()
    return root


@pytest.fixture(scope="module")
def bolt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Chronos-Bolt folder for ``export --data`` (the data is read before the model loads)."""
    pytest.importorskip("chronos")
    from families import write_tiny_bolt

    return write_tiny_bolt(tmp_path_factory.mktemp("bolt") / "bolt")


COMMANDS = ["backtest --data", "backtest --covariate-data", "score --actuals", "export --data"]


@pytest.mark.parametrize("case", sorted(CORPUS))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_malformed_file_is_one_error_line_never_a_bug(
    command: str, case: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    name, write = CORPUS[case]
    bad = tmp_path / name
    write(bad)
    if command == "backtest --data":
        arguments = _backtest(tmp_path, bad)
    elif command == "backtest --covariate-data":
        arguments = _backtest(tmp_path, Path(REFERENCE_DATASET), "--covariate-data", str(bad))
        arguments += ["--covariates", "temperature"]
    elif command == "score --actuals":
        log = request.getfixturevalue("forecast_log")
        arguments = ["score", "--forecasts", str(log), "--actuals", str(bad), "--output", str(tmp_path / "score")]
    else:
        pretrained = request.getfixturevalue("bolt")
        arguments = ["export", "chronos_bolt", "--from-pretrained", str(pretrained), "--data", str(bad)]
        arguments += ["--output", str(tmp_path / "model.onnx")]
    code = cli.main(arguments)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code in (2, 3), (code, err)
    assert len(errors) == 1 and "Traceback" not in err, err
    assert name in errors[0] and "internal error" not in errors[0], errors[0]
