"""Settings no run could use, refused by ``distributed-onnx`` itself (a subprocess, as a user runs it): one line,
exit 2, before Ray starts or anything is measured or made.

An outside attack found each of these accepted, or refused late in someone else's words: ``--output ftp://...``
ran through Ray's start to an I/O error naming no URL, ``--output -`` made a folder ``-``, ``./s3:/x`` (a local
folder, written as one) was refused as a URL without its ``//``, and ``--port 18523.0`` served on 18523.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from distributed_onnx.resources import REFERENCE_CHECKPOINT

if TYPE_CHECKING:
    import pyarrow as pa

COMMAND = [sys.executable, "-m", "distributed_onnx"]
#: A location whose user-info and option value must never be shown.
FTP = "ftp://someone:pa55word@127.0.0.1:9/runs/x?token=t0ken-value"
SUPPORTED = "give a local {} or a URL of s3://, gs://, gcs://, abfs://, abfss://, hdfs://, viewfs://."


def run_cli(arguments: list[str], folder: Path, **environment: str) -> tuple[int, list[str]]:
    """The command's exit code and its non-empty lines (stdout and stderr), run in ``folder``."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"} | environment
    result = subprocess.run(
        [*COMMAND, *arguments], check=False, cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    return result.returncode, [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


#: Every command that writes its ``--output``, with the other settings it needs, and what its output is.
WRITING_COMMANDS = pytest.mark.parametrize(
    ("arguments", "what"),
    [
        (["backtest", "--n-windows", "1"], "folder"),
        (["fev", "benchmark.yaml"], "folder"),
        (["score", "--forecasts", "log", "--actuals", "actuals.parquet"], "folder"),
        (["tune", str(REFERENCE_CHECKPOINT), "--budget-s", "5"], "file"),
    ],
    ids=["backtest", "fev", "score", "tune"],
)


@WRITING_COMMANDS
def test_an_output_no_write_can_reach_is_one_line_naming_it_redacted(
    arguments: list[str], what: str, tmp_path: Path
) -> None:
    """``ftp://`` (any scheme the storage does not write) and ``-`` are refused by every command that writes its
    output, by the one check (``evaluation/output_checks.check_output_reachable``), before anything is made."""
    code, lines = run_cli([*arguments, "--output", FTP], tmp_path)
    assert code == 2, lines
    assert lines == [
        "error: --output ftp://***@127.0.0.1:9/runs/x?token=***: this package does not write to ftp:// locations; "
        + SUPPORTED.format(what)
    ]
    # A URL without its // is refused as such, its user-info and option values masked (attack G: the query
    # value was printed, twice).
    code, lines = run_cli([*arguments, "--output", "s3:/AKIA:SECRETXYZ@bucket/run?secret_key=TOPSECRET99"], tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert "s3:/***@bucket/run?secret_key=***" in lines[0], lines
    assert "SECRETXYZ" not in lines[0] and "TOPSECRET99" not in lines[0], lines
    code, lines = run_cli([*arguments, "--output", "-"], tmp_path)
    assert code == 2, lines
    assert lines == [
        f"error: --output - is not standard output here: the command writes a {what}, and would make one named "
        f"'-'; give a {what} (./- for one of that name)."
    ]
    assert not any(tmp_path.iterdir())  # no folder '-', nothing written


def test_the_file_systems_root_is_refused_as_an_output_in_one_line(tmp_path: Path) -> None:
    """``--output file://`` (the root) listed the whole file system, through /proc's loops, to an exit-3
    PermissionError on a 700-byte line (attack G)."""
    for output in ("file://", "/"):
        code, lines = run_cli(["backtest", "--output", output, "--n-windows", "1"], tmp_path)
        assert (code, lines) == (2, [f"error: --output {output} is the file system's root; give a folder in it."])


def test_an_output_name_longer_than_the_file_system_takes_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A 300-byte folder name was an ``I/O error: File name too long`` (exit 3, "rerun to resume") once the run
    had started (attack G): bad input, exit 2, one line, nothing made."""
    code, lines = run_cli(["backtest", "--output", f"runs/{'L' * 300}/x", "--n-windows", "1"], tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert "is 300 bytes, longer than the 255 this file system takes; give a shorter one." in lines[0], lines
    assert not any(tmp_path.iterdir())


@WRITING_COMMANDS
def test_an_output_path_longer_than_the_file_system_takes_is_refused_before_anything_starts(
    arguments: list[str], what: str, tmp_path: Path
) -> None:
    """A 5,000-byte ``--output`` of short names was ``File name too long`` (exit 3) once the run had started, on a
    5,000-character line (attack H): refused by every command that writes, one short line, exit 2, nothing made."""
    code, lines = run_cli([*arguments, "--output", "/".join(["d" * 200] * 25)], tmp_path)
    assert code == 2 and len(lines) == 1 and len(lines[0]) < 300, lines
    assert lines[0].startswith(f"error: --output {'d' * 60}...: its path is "), lines
    assert "bytes (from the file system's root), longer than the 3584 an output may be on this file system" in lines[0]
    assert not any(tmp_path.iterdir())


def test_a_local_path_written_with_dot_slash_is_local_even_with_a_colon(tmp_path: Path) -> None:
    """``./s3:/x`` is a folder ``s3:`` in the working directory, written plainly as a local path: it passes the
    output checks (the run stops at the next one, the quantile levels, before Ray starts); ``s3:/x`` without its
    ``./`` is still refused as a URL without its ``//``."""
    code, lines = run_cli(["backtest", "--output", "./s3:/x", "--quantiles", "0.001,0.5"], tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: quantile level(s) 0.001 lie outside"), lines
    code, lines = run_cli(["backtest", "--data", "s3:/u:pw@b/x.parquet?token=TOKSECRET1", "--output", "run"], tmp_path)
    assert code == 2 and len(lines) == 1 and "TOKSECRET1" not in lines[0], lines  # its query masked as a URL's
    assert "s3:/***@b/x.parquet?token=***" in lines[0], lines
    # user-info with its colon percent-encoded, or a space in it, is user-info all the same (attack H)
    for output in ("s3:/K%3ASECRETPW@b/x", "s3:/K: SECRETPW@b/x y"):
        code, lines = run_cli(["backtest", "--output", output], tmp_path)
        assert code == 2 and len(lines) == 1 and "SECRETPW" not in lines[0], lines
        assert "--output s3:/***@b/x" in lines[0], lines
    code, lines = run_cli(["backtest", "--output", "s3:/x"], tmp_path)
    assert (code, lines) == (
        2,
        [
            "error: --output s3:/x looks like a URL without its // (SCHEME://BUCKET/PATH); write it whole, or give "
            "a local folder of that name as ./s3:/x."
        ],
    )


def test_an_integer_setting_takes_only_a_whole_number_written_as_one(tmp_path: Path) -> None:
    """``--port 18523.0`` served on 18523 while ``--stride 1.5`` was refused: every integer setting, of every
    command and from every source, takes digits only (one rule: ``CommandSettings``)."""
    arguments = ["backtest", "--n-windows", "3.0", "--stride", "1.5", "--output", "run"]
    code, lines = run_cli(arguments, tmp_path, DISTRIBUTED_ONNX_ACTORS="2.0")
    assert code == 2, lines
    assert lines == [
        "error: Invalid backtest settings: "
        "--n-windows: is '3.0', not a whole number; give one written as digits only (such as 3) [from command line]; "
        "--stride: is '1.5', not a whole number; give one written as digits only (such as 3) [from command line]; "
        "actors: is '2.0', not a whole number; give one written as digits only (such as 2) "
        "[from environment DISTRIBUTED_ONNX_ACTORS]"
    ]
    code, lines = run_cli(["serve", "--port", "18523.0", "--grpc-port", "1e4"], tmp_path)
    assert code == 2, lines
    assert lines == [
        "error: Invalid serve settings: "
        "--port: is '18523.0', not a whole number; give one written as digits only (such as 18523) "
        "[from command line]; "
        "--grpc-port: is '1e4', not a whole number; give one written as digits only (such as 10000) "
        "[from command line]"
    ]
    assert not any(tmp_path.iterdir())
    # A config file reads integers as YAML 1.2 does (digits, base 10): YAML 1.1's 1:00 (60), 0x10 (16) and
    # 010 (8) were planned as such (n_windows 60 from "1:00"), while the same text as a flag was refused.
    (tmp_path / "run.yaml").write_text("n_windows: 1:00\nstride: 0x10\nwindows_per_part: 010\noutput: run\n")
    code, lines = run_cli(["backtest", "--config", "run.yaml", "--quantiles", "0.001,0.5"], tmp_path)
    assert code == 2, lines
    assert lines == [
        "error: Invalid backtest settings: "
        "n_windows: is '1:00', not a whole number; give one written as digits only (such as 3) [from run.yaml]; "
        "stride: is '0x10', not a whole number; give one written as digits only (such as 3) [from run.yaml]"
    ]  # windows_per_part 010 is 10, as the flag --windows-per-part 010 is


def test_a_fev_task_whose_target_holds_no_numbers_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A task whose target column is letters (or numbers written as text, which fev's scoring does not cast) was
    rejected once Ray had started, pair by pair, and no rerun could get past it: refused up front now, from its
    Parquet file's schema, naming the task, the column and its type (exit 2, nothing written)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    stamps = pa.array([[1_600_000_000_000 + hour * 3_600_000 for hour in range(48)]], pa.list_(pa.timestamp("ms")))
    data = tmp_path / "letters" / "data.parquet"
    data.parent.mkdir()
    pq.write_table(pa.table({"id": ["a"], "timestamp": stamps, "target": [[f"x{i}" for i in range(48)]]}), data)
    task = {"dataset_path": str(data), "task_name": "letters", "horizon": 8}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({"tasks": [task]}))
    code, lines = run_cli(["fev", "bench.yaml", "--output", "out"], tmp_path)
    assert (code, lines) == (
        2,
        [
            f"error: fev task 'letters', 1 of 1 in the benchmark: its target column 'target' in {data} holds string "
            "values, not numbers; the families forecast numbers: fix the task's data or its target, or drop the task."
        ],
    )
    assert not (tmp_path / "out").exists()


def _hourly_table(**columns: object) -> pa.Table:
    """One series of 48 hourly numbers, with ``columns`` added (or replacing ``target``)."""
    import pyarrow as pa

    stamps = pa.array([[1_600_000_000_000 + hour * 3_600_000 for hour in range(48)]], pa.list_(pa.timestamp("ms")))
    fields = {"id": ["a"], "timestamp": stamps, "target": [[float(i) for i in range(48)]], **columns}
    return pa.Table.from_arrays(
        [pa.array(value) if isinstance(value, list) else value for value in fields.values()], names=list(fields)
    )


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("empty", "its dataset_path {path} is empty (0 bytes): Parquet file size is 0 bytes; "),
        (
            "png",
            "its dataset_path {path} is not a Parquet file (or a torn one): Parquet magic bytes not found in "
            "footer. Either the file is corrupted or this is not a parquet file.; ",
        ),
        (
            "csv",
            "its dataset_path {path} is not a Parquet file (or a torn one): Parquet magic bytes not found in "
            "footer. Either the file is corrupted or this is not a parquet file.; ",
        ),
    ],
    ids=["empty", "png", "csv"],
)
def test_a_fev_task_whose_data_file_is_empty_or_not_parquet_is_refused_before_anything_starts(
    case: str, problem: str, tmp_path: Path
) -> None:
    """An empty file, a PNG or a CSV named ``.parquet`` printed pyarrow's and the datasets loader's own lines, then
    exited 1 "rerun to retry the failed ones", though no rerun changes the file: refused up front now from its
    footer, one line naming the task, the file and what is wrong with it (exit 2, nothing written)."""
    import yaml

    data = tmp_path / "data" / f"{case}.parquet"
    data.parent.mkdir()
    contents = {"empty": b"", "png": b"\x89PNG\r\n\x1a\n" + bytes(64), "csv": b"id,timestamp,target\na,2020,1\n"}
    data.write_bytes(contents[case])
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({"tasks": [{"dataset_path": str(data), "task_name": case}]}))
    code, lines = run_cli(["fev", "bench.yaml", "--output", "out"], tmp_path)
    assert (code, lines) == (
        2,
        [
            f"error: fev task {case!r}, 1 of 1 in the benchmark: {problem.format(path=data)}fev loads a task's data "
            "from a Parquet or Arrow file: write the task's data as Parquet there, or drop the task."
        ],
    )
    assert not (tmp_path / "out").exists()


def test_a_fev_task_whose_parquet_repeats_a_column_name_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Two columns named ``target`` ended in exit 4, ``internal error: KeyError: 'Column target does not exist in
    schema'``, once Ray had started: refused up front now, naming the task, the file and the repeated names."""
    import pyarrow.parquet as pq
    import yaml

    data = tmp_path / "twice" / "data.parquet"
    data.parent.mkdir()
    table = _hourly_table()
    pq.write_table(table.append_column("target", table.column("target")).append_column("id", table.column("id")), data)
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({"tasks": [{"dataset_path": str(data), "task_name": "twice"}]}))
    code, lines = run_cli(["fev", "bench.yaml", "--output", "out"], tmp_path)
    assert (code, lines) == (
        2,
        [
            f"error: fev task 'twice', 1 of 1 in the benchmark: its dataset_path {data} holds two or more columns "
            "named 'id', 'target'; fev's loader reads each column by its name: give each column of the file its own "
            "name, or drop the task."
        ],
    )
    assert not (tmp_path / "out").exists()


def test_a_fev_task_whose_relative_dataset_path_names_no_file_from_here_is_refused(tmp_path: Path) -> None:
    """fev reads a relative ``dataset_path`` from the working directory. Run from another folder, the up-front
    checks skipped it (no file there) and the task "failed" (exit 1, "rerun to retry"), though a rerun from there
    fails the same: refused now, naming the path and where it was looked for. From the folder it is relative to,
    the same check reads the same file fev will: a target of letters there is refused by it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    letters = pa.array([[f"x{i}" for i in range(48)]])
    table = _hourly_table(target=letters)
    pq.write_table(table, project / "data" / "letters.parquet")
    task = {"dataset_path": "data/letters.parquet", "task_name": "rel"}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({"tasks": [task]}))

    code, lines = run_cli(["fev", str(tmp_path / "bench.yaml"), "--output", "out"], elsewhere)
    assert (code, lines) == (
        2,
        [
            "error: fev task 'rel', 1 of 1 in the benchmark: its dataset_path data/letters.parquet is relative, and "
            f"fev reads it from the working directory, where {elsewhere / 'data' / 'letters.parquet'} does not "
            "exist: run from the folder it is relative to, or give the path in full."
        ],
    )
    assert not (elsewhere / "out").exists()
    code, lines = run_cli(["fev", str(tmp_path / "bench.yaml"), "--output", "out"], project)
    assert code == 2, lines
    assert lines == [
        "error: fev task 'rel', 1 of 1 in the benchmark: its target column 'target' in data/letters.parquet holds "
        "string values, not numbers; the families forecast numbers: fix the task's data or its target, or drop the "
        "task."
    ]


#: Secrets too short to be remembered for masking in free text (``redact.SHORTEST_REMEMBERED``): each is a whole
#: field of its URL (user name, password, option value, fragment), masked wherever the URL is shown.
SHORT_SECRETS = ("k3y", "pw9", "tk7", "fr8")
#: A backtest's other settings, for a checkpoint's refusal (refused before any of these is looked at).
AND_THE_REST = ["--data", "data.parquet", "--output", "out"]


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        (["backtest", *AND_THE_REST, "--checkpoint", "s3:/k3y:pw9@b/x?tk=tk7#fr8"], "s3:/***@b/x?tk=***#***"),
        (["backtest", *AND_THE_REST, "--checkpoint", "s3:/k3y:pw9@b/x?tk=tk7"], "s3:/***@b/x?tk=***"),
        (["backtest", *AND_THE_REST, "--checkpoint", "gs:/b/x?token=tk7"], "gs:/b/x?token=***"),
        (["backtest", *AND_THE_REST, "--checkpoint", "s3:/k3y:p(w9)%40@b/x?tk=tk7"], "s3:/***@b/x?tk=***"),
        (["backtest", *AND_THE_REST, "--checkpoint", "s3://k3y:p(w9)%40@b/x?tk=tk7#fr8"], "s3://***@b/x?tk=***#***"),
        (["backtest", *AND_THE_REST, "--checkpoint", "gs://b/x?token=tk7"], "gs://b/x?token=***"),
        (["tune", "s3:/k3y:pw9@b/x?tk=tk7#fr8", "--output", "out"], "s3:/***@b/x?tk=***#***"),
        (["backtest", "--config", "s3:/k3y:pw9@b/x.yaml?tk=tk7#fr8"], "s3:/***@b/x.yaml?tk=***#***"),
        (["fev", "s3:/K:S@b/x.yaml?t=T#F", "--output", "out"], "directory: 's3:/***@b/x.yaml?t=***#***'"),
    ],
    ids=["no-slashes", "no-fragment", "gs-no-slashes", "parens-percent", "slashes", "gs", "tune", "config", "fev"],
)
def test_a_checkpoint_or_file_given_as_a_url_shows_every_field_of_it_masked(
    arguments: list[str], shown: str, tmp_path: Path
) -> None:
    """``--checkpoint 's3:/K:S@b/x?token=T#F'`` (a URL without its ``//``) was read as a local path, and the names
    rule quoted its stem ``x?token=T#F`` raw (attack H); a library's ``No such file: 's3:/K:S@b/x.yaml?token=T#F'``
    was shown with its short secrets too. A checkpoint in that form is refused as such, and every URL shown has each
    field masked whatever its length: one line, exit 2, nothing made."""
    code, lines = run_cli(arguments, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert shown in lines[0], lines
    assert not any(secret in lines[0] for secret in SHORT_SECRETS), lines
    if "--checkpoint" in arguments or arguments[0] == "tune":
        assert "looks like a URL without its //" in lines[0] or "is a URL, but it is read from a local file" in lines[0]
    assert not (tmp_path / "out").exists()


def test_argparse_refusing_a_line_masks_every_field_of_the_locations_it_quotes(tmp_path: Path) -> None:
    """argparse's own errors ("unrecognized arguments", "invalid choice") quoted a URL written without its ``//``
    with its option values and fragment (attack H), and secrets too short to be remembered with them: every word of
    the line that is a location is shown as the CLI shows a location, each field masked."""
    for arguments, shown in [
        (
            ["backtest", "--output", "s3:/b/x?secret_key=tk7", "--bogus-flag", "s3:/k3y:pw9@b/y?tk=tk7#fr8"],
            "unrecognized arguments: --bogus-flag s3:/***@b/y?tk=***#***",
        ),
        (
            ["backtest", "--outptu=s3:/k3y:pw9@b/x?tk=tk7#fr8"],
            "unrecognized arguments: --outptu=s3:/***@b/x?tk=***#***",
        ),
        (["s3:/b/x?tk=tk7#fr8"], "invalid choice: 's3:/b/x?tk=***#***'"),
        (["backtest", "--output", "gs://b/x?token=tk7", "stray"], "unrecognized arguments: stray"),
    ]:
        code, lines = run_cli(arguments, tmp_path)
        errors = [line for line in lines if line.startswith("error: ")]
        assert code == 2 and len(errors) == 1 and shown in errors[0], lines
        assert not any(secret in line for line in lines for secret in SHORT_SECRETS), lines


def test_a_fev_task_whose_dataset_path_is_a_folder_or_a_loop_of_links_is_refused_naming_what_it_is(
    tmp_path: Path,
) -> None:
    """A folder as ``dataset_path`` (``data.parquet/``) failed at the load once the run had started (exit 1, "rerun
    to retry the failed ones"), and a link to itself was said not to exist, or failed there too (attack H): each is
    refused up front now, naming the task, the path and what it is (exit 2, nothing written)."""
    import yaml

    (tmp_path / "folder.parquet").mkdir()
    (tmp_path / "loop.parquet").symlink_to("loop.parquet")
    for dataset_path, what in [
        (str(tmp_path / "folder.parquet"), "is a folder; fev loads a task's data from one Parquet or Arrow file"),
        ("loop.parquet", "is a loop of symbolic links (Too many levels of symbolic links), which leads to no file"),
    ]:
        (tmp_path / "bench.yaml").write_text(
            yaml.safe_dump({"tasks": [{"dataset_path": dataset_path, "task_name": "t"}]})
        )
        code, lines = run_cli(["fev", "bench.yaml", "--output", "out"], tmp_path)
        assert (code, len(lines)) == (2, 1), lines
        assert lines[0].startswith(
            f"error: fev task 't', 1 of 1 in the benchmark: its dataset_path {dataset_path} {what}"
        )
        assert not (tmp_path / "out").exists()


def test_serve_with_one_port_for_http_and_grpc_names_both_flags_as_its_other_setting_errors_do(tmp_path: Path) -> None:
    """``serve --port P --grpc-port P`` said "port and grpc_port are both P", unlike every other serve setting error
    (attack H): the flags named, the prefix and the source as the others give them."""
    code, lines = run_cli(["serve", "--port", "18601", "--grpc-port", "18601"], tmp_path)
    assert (code, lines) == (
        2,
        [
            "error: Invalid serve settings: --grpc-port: is 18601, the same port as --port (HTTP); HTTP and gRPC "
            "need a port each: give --grpc-port another one [from command line]"
        ],
    )


@pytest.mark.parametrize(
    ("arguments", "environment", "config", "shown"),
    [
        (["backtest", "--address", "ray://k3y:pw9@127.0.0.1:1?tk=tk7"], {}, "", "'ray://***@127.0.0.1:1?***'"),
        (["backtest", "--address", "127.0.0.1:1?tk=tk7#fr8"], {}, "", "'127.0.0.1:1?***'"),
        (["backtest", "--address", "s3:/k3y:pw9@127.0.0.1:1#fr8"], {}, "", "'s3:/***@127.0.0.1:1#***'"),
        (["serve", "--address", "k3y:pw9@127.0.0.1:1?tk=tk7"], {}, "", "'***@127.0.0.1:1?***'"),
        (["fev", "b.yaml", "--output", "out"], {"DISTRIBUTED_ONNX_ADDRESS": "h:1?tk=tk7"}, "", "'h:1?***'"),
        (["backtest", "--output", "out", "--config", "c.yaml"], {}, "address: h:1#fr8", "'h:1#***'"),
    ],
    ids=["ray-url", "bare-query", "no-slashes", "serve", "fev-environment", "config"],
)
def test_an_address_refused_shows_every_part_of_it_masked(
    arguments: list[str], environment: dict[str, str], config: str, shown: str, tmp_path: Path
) -> None:
    """``--address 'ray://K:S@127.0.0.1:1?tok=T'`` was refused with "its port '1?tok=T' is not a number": the part
    quoted after the masked whole repeated the secret, and ``127.0.0.1:1?token=T`` was shown with nothing masked
    (attack I), from every command and source. The whole is shown once, every part after ``?`` or ``#`` masked,
    and the part at fault is named, not quoted."""
    (tmp_path / "c.yaml").write_text(config + "\n")
    (tmp_path / "b.yaml").write_text("tasks: []\n")
    code, lines = run_cli(
        [*arguments, "--n-windows", "2"] if arguments[0] == "backtest" else arguments, tmp_path, **environment
    )
    assert code == 2 and len(lines) == 1, lines
    assert "address: expected HOST:PORT" in lines[0], lines
    assert f"got {shown}: its port is not a number from 1 to 65535" in lines[0], lines
    assert not any(secret in lines[0] for secret in SHORT_SECRETS), lines


#: A local path holding URL-like text that does not start it, each with a user-info, an option and a fragment.
URL_LIKE_PATHS = ["./s3:/k3y:pw9@b/x.onnx?tk=tk7#fr8", "-s3://k3y:pw9@b/x.onnx?tk=tk7", "d/s3://k3y:pw9@b/x?tk=tk7"]


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        (["backtest", "--output", "out", "--checkpoint", URL_LIKE_PATHS[0]], "s3:/***@b/x.onnx?tk=***#***"),
        (["backtest", "--output", "out", f"--checkpoint={URL_LIKE_PATHS[1]}"], "-s3:/***@b/x.onnx?tk=***"),
        (["backtest", "--output", "out", "--data", URL_LIKE_PATHS[2]], "d/s3:/***@b/x?tk=***"),
        (["backtest", "--output", "out", "--config", URL_LIKE_PATHS[0]], "s3:/***@b/x.onnx?tk=***#***"),
        (["inspect", URL_LIKE_PATHS[0]], "s3:/***@b/x.onnx?tk=***#***"),
    ],
    ids=["checkpoint", "checkpoint-dash", "data-in-a-folder", "config", "inspect"],
)
def test_a_local_path_holding_url_like_text_shows_its_options_masked_with_its_user_info(
    arguments: list[str], shown: str, tmp_path: Path
) -> None:
    """``--checkpoint './s3:/u:pw@b/x.onnx?t=T#F'`` was refused as "not found" with the user-info masked and the
    option and fragment shown (attack I): a URL-like part of a path that does not start it was half masked. One
    rule now: where a user-info is masked, so are the options and the fragment of the same text."""
    code, lines = run_cli(arguments, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert shown in lines[0], lines
    assert not any(secret in lines[0] for secret in SHORT_SECRETS), lines


#: A checkpoint's file whose stem holds a URL-like path's options (``m?tok=...``) or fragment (``m#...``).
STEM_OF_A_URL = "x/s3:/uSR:pASSWD1@bkt/m?tok=SECRETQ1.onnx"


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        (["backtest", "--output", "out", "--checkpoint", STEM_OF_A_URL], "checkpoint name 'm?tok=***' is refused"),
        (["backtest", "--output", "out", "--checkpoint", "x/m#FRAGZZ1.onnx"], "checkpoint name 'm#***' is refused"),
        (["backtest", "--output", "out", "--checkpoint", "x?tok=SECRETQ1#FRAGZZ1.onnx"], "'x?tok=***#***'"),
        (["serve", "--checkpoint", STEM_OF_A_URL], "checkpoint name 'm?tok=***' (its file stem) is refused"),
        (["serve", "--config", "serve.yaml"], "checkpoint name 'm?tok=***' (its file stem) is refused"),
        (["export", "chronos2", "--random-weights", "--output", STEM_OF_A_URL], "its stem 'm?tok=***'"),
    ],
    ids=["backtest", "fragment", "options-and-fragment", "serve", "serve-config", "export"],
)
def test_a_checkpoint_name_cut_from_url_like_text_shows_its_options_and_fragment_masked(
    arguments: list[str], shown: str, tmp_path: Path
) -> None:
    """``--checkpoint 'x/s3:/u:pw@b/m?tok=T.onnx'``: the names rule quoted the stem ``m?tok=T`` raw (attack J), as
    the stem cut from URL-like text has lost the scheme that marks its options as a URL's. A refused name is shown
    with its options and fragment masked as the whole path's are."""
    (tmp_path / "serve.yaml").write_text(f"checkpoint:\n  - '{STEM_OF_A_URL}'\n")
    code, lines = run_cli(arguments, tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert shown in lines[0], lines
    assert "SECRETQ1" not in lines[0] and "FRAGZZ1" not in lines[0] and "pASSWD1" not in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_serve_refuses_a_forecast_log_url_without_its_slashes_as_every_output_is(tmp_path: Path) -> None:
    """``serve --forecast-log 's3:/K:S@b/log?tok=T#F'`` was a local folder ``s3:`` (the credentials in a path on
    disk, the forecasts logged here, not to the store; attack I), where ``backtest --output`` refuses the same text:
    refused by the same rule (``writable.looks_like_a_url``), from a flag or a variable, before anything starts."""
    code, lines = run_cli(["serve", "--forecast-log", "s3:/k3y:pw9@b/log?tk=tk7#fr8"], tmp_path)
    assert (code, lines) == (
        2,
        [
            "error: Invalid serve settings: --forecast-log: s3:/***@b/log?tk=***#*** looks like a URL without its // "
            "(SCHEME://BUCKET/PATH); write it whole, or give a local folder of that name as ./s3:/***@b/log?tk=***#*** "
            "[from command line]"
        ],
    )
    code, lines = run_cli(["serve"], tmp_path, DISTRIBUTED_ONNX_FORECAST_LOG="gs:b/log")
    assert code == 2 and len(lines) == 1, lines
    assert "gs:b/log looks like a URL without its //" in lines[0], lines
    assert lines[0].endswith("[from environment DISTRIBUTED_ONNX_FORECAST_LOG]"), lines
    assert not any(tmp_path.iterdir())  # no folder s3: nor gs:


#: What is at a local ``--forecast-log`` (made in the test's folder) and the line serve refuses it with: each was the
#: probe's "Cannot write the forecast log ... check credentials" (exit 3, attack J).
NO_LOG_FOLDER = "the forecast log is a folder (new, or one serve wrote): give another --forecast-log."


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("afile", f"error: --forecast-log afile is a file; {NO_LOG_FOLDER}"),
        ("afile/log", f"error: --forecast-log afile/log: afile is a file; {NO_LOG_FOLDER}"),
        (
            "/dev/null",
            f"error: --forecast-log /dev/null is not a regular file (a device, a pipe or a socket); {NO_LOG_FOLDER}",
        ),
        (
            "loopA",
            "error: --forecast-log loopA is a symbolic link to loopB, in a loop of links that leads back to itself; "
            "remove the link.",
        ),
        (
            "dangling",
            "error: --forecast-log dangling is a symbolic link to nowhere, which does not exist; make that folder or "
            "remove the link.",
        ),
        (
            "L" * 300,
            "error: --forecast-log LLLLLLLLLLLLLLLL...(268 bytes left out)...LLLLLLLLLLLLLLLL: its name "
            "LLLLLLLLLLLLLLLL...(268 bytes left out)...LLLLLLLLLLLLLLLL is 300 bytes, longer than the 255 this file "
            "system takes; give a shorter one.",
        ),
        (
            "-",
            "error: Invalid serve settings: --forecast-log: - is not standard output here: the command writes a "
            "folder, and would make one named '-'; give a folder (./- for one of that name) [from command line]",
        ),
        (
            FTP,
            "error: Invalid serve settings: --forecast-log: ftp://***@127.0.0.1:9/runs/x?token=***: this package does "
            f"not write to ftp:// locations; {SUPPORTED.format('folder')[:-1]} [from command line]",
        ),
    ],
    ids=["file", "below-a-file", "device", "loop", "dangling-link", "name-too-long", "dash", "ftp"],
)
def test_serve_refuses_a_forecast_log_no_write_could_make_as_every_output_is(
    log: str, expected: str, tmp_path: Path
) -> None:
    """A forecast log is an output: what a backtest's ``--output`` refuses (``-``, ``ftp://``: the one rule,
    ``writable.unwritable_problem``), a name too long and a path that is not a folder (``local_paths``' words) are
    bad input (exit 2), one line, before Ray starts. On main ``-`` logged into ``./-``, ``ftp://`` tried to connect
    and the rest were the probe's exit 3 "check ... its credentials" (attack J)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loopA").symlink_to("loopB")
    (tmp_path / "loopB").symlink_to("loopA")
    (tmp_path / "dangling").symlink_to("nowhere")
    code, lines = run_cli(["serve", "--forecast-log", log], tmp_path)
    assert (code, lines) == (2, [expected])
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["afile", "dangling", "loopA", "loopB"]


def test_a_serve_error_about_two_ports_names_the_source_of_each(tmp_path: Path) -> None:
    """``DISTRIBUTED_ONNX_PORT=P serve --grpc-port P`` was refused naming ``--port ... [from command line]``, the
    source of --grpc-port alone (attack I): the other port's source is named as it came, where it is another. And
    ``--port 8001`` (the default gRPC port) passed the settings and failed to bind once Ray had started."""
    code, lines = run_cli(["serve", "--grpc-port", "18623"], tmp_path, DISTRIBUTED_ONNX_PORT="18623")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].endswith(
        "the same port as --port (HTTP); HTTP and gRPC need a port each: give --grpc-port another one "
        "[from command line; --port from environment DISTRIBUTED_ONNX_PORT]"
    ), lines
    # --port 8001 alone is the default gRPC port: refused the same way, not met once Ray has started (exit 3)
    code, lines = run_cli(["serve", "--port", "8001"], tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].endswith("give --grpc-port another one [--grpc-port by default; --port from command line]"), lines
