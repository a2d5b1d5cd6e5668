"""Paths a user gives that are long, too long for the file system, or not the file they name (attack I): each
refused by ``distributed-onnx`` itself (a subprocess, as a user runs it) in one line that says what it is, exit 2.

Found by the attack: a 5,000-byte ``--output`` or ``--data`` lost the line's reason (the line was cut at 2,000
characters, the value filling it); a checkpoint or config file name over 255 bytes was an ``I/O error`` (exit 3)
advising a rerun that resumes, and ``--tuned`` called such a file "not JSON"; ``score`` into a read-only folder
failed once it wrote (exit 3); a folder or a loop of links given as ``--data``, ``--checkpoint`` or ``--config``
was "not found"; a PNG given as ``--data x.csv`` was an internal error (exit 4).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_refusals import run_cli
from test_input_columns import score_inputs

from distributed_onnx.resources import REFERENCE_CHECKPOINT

LONG = "e" * 5000
NAME = "a" * 300


def test_a_long_value_is_shown_by_its_start_and_end_and_a_secret_in_it_stays_masked() -> None:
    """:func:`one_line` shortens the long values of an over-long line, never the words around them; a URL cut in
    two keeps its secret masked (it is redacted before it is cut)."""
    from distributed_onnx.redact import one_line, quoted, shortened

    line = one_line(f"--output s3://b/{LONG}?token=SECRETVALUE1: its name is 5000 bytes; give a shorter one.")
    assert "SECRETVALUE1" not in line and line.endswith(": its name is 5000 bytes; give a shorter one."), line
    assert line.startswith("--output s3://b/eee") and "bytes left out)...eee" in line and len(line) < 300, line
    assert one_line("short line\nstays whole") == "short line stays whole"
    assert shortened("é" * 100, limit=40) == "é" * 6 + "...(176 bytes left out)..." + "é" * 6  # bytes, not characters
    assert quoted("head " + "x" * 1000 + " tail", limit=60).endswith(" tail")


@pytest.mark.parametrize(
    "arguments",
    [
        ["backtest", "--n-windows", "5", "--output", LONG],
        ["score", "--forecasts", "log", "--actuals", "actuals.parquet", "--output", LONG],
        ["tune", str(REFERENCE_CHECKPOINT), "--budget-s", "5", "--output", LONG],
        ["backtest", "--output", "run", "--data", LONG],
    ],
    ids=["backtest-output", "score-output", "tune-output", "data"],
)
def test_a_5000_byte_path_is_shortened_and_the_reason_and_the_fix_stay_whole(
    arguments: list[str], tmp_path: Path
) -> None:
    """The error line was cut at 2,000 characters, all of them the path's: its start and end now, how many bytes
    were left out, and the whole reason and what to do."""
    code, lines = run_cli(arguments, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    line = lines[0]
    assert len(line) < 600 and "bytes left out)..." in line, line
    assert f"is 5000 bytes, longer than the {os.pathconf(tmp_path, 'PC_NAME_MAX')} this file system takes" in line
    assert line.endswith(("; give a shorter one.", "to a shorter name, or give another.")), line


@pytest.mark.parametrize(
    "arguments",
    [
        ["backtest", "--output", "run", "--checkpoint", f"names/{NAME}.onnx"],
        ["backtest", "--output", "run", "--config", f"names/{NAME}.yaml"],
        ["backtest", "--output", "run", "--tuned", f"names/{NAME}.json"],
        ["inspect", f"names/{NAME}.onnx"],
        ["serve", "--checkpoint", f"names/{NAME}.onnx"],
        ["tune", f"names/{NAME}.onnx", "--output", "tuned.json"],
        ["score", "--forecasts", f"names/{NAME}", "--actuals", "a.parquet", "--output", "scored"],
    ],
    ids=["checkpoint", "config", "tuned", "inspect", "serve", "tune", "score-forecasts"],
)
def test_an_input_name_longer_than_the_file_system_takes_is_bad_input(arguments: list[str], tmp_path: Path) -> None:
    """A 300-byte file name was an ``I/O error`` (exit 3: "rerun the same command to resume", "Fix it and rerun"),
    or "not JSON" for ``--tuned``: the system refuses the path itself (``ENAMETOOLONG``), which no rerun gets
    past. One line naming the path and the limit, exit 2, from every command (``cli_errors``: ``local_paths``)."""
    (tmp_path / "names").mkdir()
    given = next(argument for argument in arguments if argument.startswith("names/"))
    code, lines = run_cli(arguments, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    size = len(Path(given).name)
    assert lines[0].startswith(f"error: Cannot use the path {given}: its name {'a' * 16}...("), lines
    assert lines[0].endswith(
        f" is {size} bytes, longer than the {os.pathconf(tmp_path, 'PC_NAME_MAX')} this file system takes. Rename "
        "the file (or folder) to a shorter name, or give another."
    ), lines


def _png() -> bytes:
    """A real 4x1 PNG image: its bytes are not text."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 4, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + b"\xff\x00\x00" * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.fixture
def odd_paths(tmp_path: Path) -> Path:
    """A folder holding a folder ``adir``, two links in a loop (``loopA`` -> ``loopB`` -> ``loopA``), a link to
    nothing (``gone`` -> ``nothere.json``) and a PNG image named ``pic.csv``."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "gone").symlink_to("nothere.json")
    (tmp_path / "loopA").symlink_to("loopB")
    (tmp_path / "loopB").symlink_to("loopA")
    (tmp_path / "pic.csv").write_bytes(_png())
    return tmp_path


LOOP = "is a symbolic link to loopB, in a loop of links that leads back to itself"
GONE = "is a symbolic link to nothere.json, which does not exist"
DEVICE = "is not a regular file (a device, a pipe or a socket)"
TUNED = "give the JSON file distributed-onnx tune wrote"
COVARIATES = ["--covariates", "wind", "--covariate-data"]


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (["--data", "adir"], "Data file adir is a folder; give a data file (.parquet, or .csv)."),
        (["--data", "loopA"], f"Data file loopA {LOOP}; give a data file (.parquet, or .csv)."),
        (
            ["--checkpoint", "loopA"],
            f"Checkpoint weights loopA {LOOP}; give the checkpoint's .onnx file, or its folder",
        ),
        (["--config", "adir"], "Config file adir is a folder; give a YAML file"),
        (["--output", "loopA"], f"--output loopA {LOOP}; remove the link, or give another --output."),
        (
            ["--data", "pic.csv"],
            "Data file pic.csv is not text (byte 0 is 0x89: a binary file, such as an image or a Parquet file), so "
            "it cannot be read as CSV; give a CSV file saved as UTF-8 text, or a Parquet file.",
        ),
        (["--tuned", "adir"], f"Tuned settings file adir is a folder; {TUNED}"),
        (["--tuned", "loopA"], f"Tuned settings file loopA {LOOP}; {TUNED}"),
        (["--tuned", "gone"], f"Tuned settings file gone {GONE}; {TUNED}"),
        (["--tuned", "/dev/null"], f"Tuned settings file /dev/null {DEVICE}; {TUNED}"),
        ([*COVARIATES, "adir"], "Data file adir is a folder; give a data file (.parquet, or .csv)."),
        ([*COVARIATES, "loopA"], f"Data file loopA {LOOP}; give a data file (.parquet, or .csv)."),
        ([*COVARIATES, "gone"], f"Data file gone {GONE}; give a data file (.parquet, or .csv)."),
        ([*COVARIATES, "/dev/null"], f"Data file /dev/null {DEVICE}; give a data file (.parquet, or .csv)."),
    ],
    ids=[
        "data-folder",
        "data-loop",
        "checkpoint-loop",
        "config-folder",
        "output-loop",
        "data-png",
        *(f"tuned-{kind}" for kind in ("folder", "loop", "gone", "device")),
        *(f"covariate-data-{kind}" for kind in ("folder", "loop", "gone", "device")),
    ],
)
def test_what_is_there_instead_of_the_file_is_said(arguments: list[str], line: str, odd_paths: Path) -> None:
    """A folder or a loop of links was "not found" (``--output``'s loop "a link to loopB, which does not exist"),
    and a PNG read as CSV an internal error (exit 4): each said for what it is, exit 2, nothing made. ``--tuned``
    and ``--covariate-data`` printed the system's errno text ("not JSON ([Errno 40] ...)", "Failed to open local
    file", attack J): the same words now."""
    arguments = ["backtest", "--n-windows", "2", *arguments]
    if "--output" not in arguments:
        arguments += ["--output", "run"]
    assert run_cli(arguments, odd_paths) == (2, [f"error: {line}"])
    assert not (odd_paths / "run").exists()


@pytest.mark.parametrize(
    ("given", "there"),
    [("loopA", LOOP), ("gone", GONE), ("/dev/null", DEVICE)],
    ids=["loop", "gone", "device"],
)
def test_score_says_what_its_forecasts_are_when_not_a_folder(given: str, there: str, odd_paths: Path) -> None:
    """``score --forecasts`` a loop of links said it "does not exist", and ``/dev/null`` that it "is a file"
    (attack J): said as every input's (``local_paths``), exit 2."""
    arguments = ["score", "--forecasts", given, "--actuals", "a.parquet", "--output", "scored"]
    expected = "(expected the folder `distributed-onnx serve --forecast-log` writes (day=*/model=*/part-*.parquet))."
    assert run_cli(arguments, odd_paths) == (2, [f"error: --forecasts {given} {there} {expected}"])
    assert not (odd_paths / "scored").exists()


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    """An empty folder no one may write in, root included (``chattr +i``: root ignores ``chmod``), made writable
    again after the test; the test is skipped where the file system has no such attribute."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    chattr = shutil.which("chattr")
    made = (
        chattr is not None and subprocess.run([chattr, "+i", folder], check=False, capture_output=True).returncode == 0
    )
    if not made:
        pytest.skip("chattr +i is not available here (no chattr, or a file system without the attribute)")
    try:
        yield folder
    finally:
        subprocess.run([str(chattr), "-i", folder], check=True)


@pytest.mark.parametrize("below", [False, True], ids=["the-folder", "a-new-folder-in-it"])
def test_score_refuses_a_folder_it_cannot_write_before_it_reads(immutable: Path, tmp_path: Path, below: bool) -> None:
    """``score --output`` a read-only folder read and scored, then failed writing (exit 3, "rerun to resume"),
    where ``backtest`` and ``tune`` refuse it up front: the same refusal now (``output_checks``), exit 2. A new
    folder in a read-only one (attack J) failed making it (exit 3): refused naming where it would be made."""
    score_inputs(tmp_path)  # a forecast log (tmp_path/log) and its actuals (tmp_path/actuals.parquet)
    output = immutable / "sub" if below else immutable
    where = f": it would be made in {immutable}, which cannot be written" if below else ""
    arguments = ["score", "--forecasts", "log", "--actuals", "actuals.parquet", "--output", str(output)]
    assert run_cli(arguments, tmp_path) == (
        2,
        [
            f"error: --output {output} cannot be written{where} (read-only, or no permission); make it writable, "
            "or give another --output."
        ],
    )


def test_a_fev_task_whose_relative_dataset_path_is_a_folder_from_elsewhere_is_refused(tmp_path: Path) -> None:
    """A relative ``dataset_path`` naming a folder (``adir``), run from another folder, was a pair "rejected" for
    its suffix (exit 1, "the others' summaries are in ..." with no others): the up-front check of a relative path
    that names nothing from here now asks it whatever its suffix, exit 2, before Ray."""
    (tmp_path / "project" / "adir").mkdir(parents=True)
    (tmp_path / "bench.yaml").write_text("tasks:\n- {dataset_path: adir, horizon: 4, num_windows: 1, task_name: t}\n")
    code, lines = run_cli(["fev", str(tmp_path / "bench.yaml"), "--output", "out"], tmp_path)
    assert (code, lines) == (
        2,
        [
            "error: fev task 't', 1 of 1 in the benchmark: its dataset_path adir is relative, and fev reads it from "
            f"the working directory, where {tmp_path / 'adir'} does not exist: run from the folder it is relative "
            "to, or give the path in full."
        ],
    )
    assert not (tmp_path / "out").exists()
