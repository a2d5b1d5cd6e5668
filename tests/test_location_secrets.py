"""Issue 51, the class test: no command shows a location's secret, whatever flag the location is given to.

Locations were strings handled per command, and each command leaked in its own way (a URL folded by ``Path``
into ``https:/user:PASSWORD@...``, a redaction that stopped at ``(``, fev's task names). Here every command of
the parser (:func:`distributed_onnx.cli._parser`) is run with every one of its location flags, found from the
parser itself (a flag parsed as a :class:`~distributed_onnx.location.Location`, or a settings field typed
``Location``/``Path``), given locations whose credentials sit in the user-info, the query, a scheme-less path,
inside parentheses and among quotes; what it printed and every file it wrote (a traceback log included) is
searched for each secret. A new command or a new location flag is picked up by itself; a flag that takes a path
but is not parsed as a Location fails the test (it would be handled as a string again).

Integration tier (a run that gets far enough builds ORT sessions; Ray is refused, so none starts it): seconds
per flag. Then a real backtest on ``file://`` URLs with secrets in their options, and a real fev run whose
task's dataset path holds credentials, every file they wrote searched.
"""

from __future__ import annotations

import argparse
import re
import socket
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from distributed_onnx import cli
from distributed_onnx.location import Location
from distributed_onnx.redact import redact
from distributed_onnx.settings_flags import is_location_field

DATA = Path(__file__).parents[1] / "distributed_onnx" / "resources" / "taylor.parquet"

#: The secrets, each unique so that a search finds it anywhere.
SECRETS = ("AKIA51KEY", "SeCrEtUi51", "SeCrEtQs51", "SeCrEtQt51", "SeCrEtPath51")


def secret_locations(name: str) -> list[str]:
    """Locations of a file or folder ``name`` carrying every kind of secret: a URL with user-info (a password with
    parentheses and quotes), a path with parentheses and a quote, a query whose values hold quotes; and a
    scheme-less user-info (how fev names a task after ``s3://KEY:SECRET@bucket/dir/...``)."""
    return [
        f"https://AKIA51KEY:pa(SeCrEtUi51)w'o\"rd@127.0.0.1:1/sales(2024)/it's/{name}?sig=SeCrEtQs51&q='SeCrEtQt51\"",
        f"user51:SeCrEtPath51@host/dir/{name}",
    ]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _is_location_action(action: argparse.Action, fields: dict[str, Any]) -> bool:
    if action.type is not None and getattr(action.type, "__func__", None) is Location.parse.__func__:
        return True
    field = fields.get(action.dest)
    return field is not None and is_location_field(field)


def _looks_like_a_path(action: argparse.Action) -> bool:
    """A flag that takes a place by its look: typed Path, or named so (PATH, DIR, FILE.json, MODEL.onnx)."""
    metavar = str(action.metavar or "")
    if action.choices or metavar.startswith("{"):  # a choice of words
        return False
    return action.type is Path or re.search(r"PATH|\bDIR\b|FILE|\.(onnx|yaml|json|parquet)$", metavar, re.I) is not None


def location_flags() -> list[tuple[str, str, str]]:
    """``(command, flag, dest)`` for every location flag of every command (a positional's flag is its dest)."""
    found = []
    for command in _subparsers(cli._parser([])):
        parser = _subparsers(cli._parser([command]))[command]
        source = parser.get_default("settings_cli_source")  # the settings model of a generated command
        fields = dict(source.settings_cls.model_fields) if source is not None else {}
        for action in parser._actions:
            if not action.option_strings and not action.dest:
                continue
            flag = action.option_strings[-1] if action.option_strings else action.dest
            if _is_location_action(action, fields):
                found.append((command, flag, action.dest))
            else:
                assert not _looks_like_a_path(action), (
                    f"{command} {flag} takes a path but is not parsed as a Location (type=Location.parse, or a "
                    "settings field typed Location): it would be handled as a string, unredacted"
                )
    return found


FLAGS = location_flags()


def test_every_command_has_its_location_flags_found() -> None:
    """The enumeration itself: every command with a location, and the flags each is known to have."""
    by_command: dict[str, set[str]] = {}
    for command, flag, _ in FLAGS:
        by_command.setdefault(command, set()).add(flag)
    assert {"inspect", "export", "tune", "fev", "backtest", "serve", "score"} <= set(by_command), by_command
    assert {"--data", "--output", "--covariate-data", "--checkpoint", "--config", "--tuned"} <= by_command["backtest"]
    assert {"--forecast-log", "--model-repository", "--checkpoint", "--config"} <= by_command["serve"]
    assert {"--forecasts", "--actuals", "--output", "--backtest"} <= by_command["score"]
    assert {"--from-pretrained", "--output", "--data"} <= by_command["export"]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, busy_port: int) -> dict[str, str]:
    """Harmless values for the location flags a run needs besides the one under test (and a busy port)."""
    from graphs import write_tiny_chronos2

    root = tmp_path_factory.mktemp("places")
    write_log(root / "log")
    (root / "pretrained").mkdir()
    benchmark = root / "bench.yaml"
    benchmark.write_text(f"tasks:\n- dataset_path: {DATA}\n  horizon: 4\n")
    return {
        "checkpoint": str(write_tiny_chronos2(root / "models").weights_path),
        "data": str(DATA),
        "actuals": str(DATA),
        "forecasts": str(root / "log"),
        "benchmark": str(benchmark),
        "from_pretrained": str(root / "pretrained"),
        "busy_port": str(busy_port),
    }


#: The origin of the logged forecast: inside the bundled data, so that score places it and reads its actuals.
LOGGED_ORIGIN = datetime(2000, 8, 20, tzinfo=UTC)


def write_log(root: Path) -> None:
    """A forecast log holding one served forecast of the bundled series, as serve writes it: ``score`` reads its
    part, then the actuals the forecast is placed on (a stand-in part that does not read would stop it first)."""
    import numpy as np

    from distributed_onnx.live.log.layout import LoggedForecast
    from distributed_onnx.live.log.writer import ForecastLog

    log = ForecastLog(root, flush_interval_s=60.0)
    assert log.submit(
        LoggedForecast(
            model="tiny",
            checkpoint_sha256="0" * 64,
            role="served",
            request_id="request-51",
            request_time_us=int(LOGGED_ORIGIN.timestamp() * 1e6),
            resolution_minutes=30,
            series_ids=["taylor_ew"],
            origins_us=[int(LOGGED_ORIGIN.timestamp() * 1e6)],
            quantiles=(0.1, 0.5, 0.9),
            forecasts=np.full((1, 4, 3), 30_000.0, dtype=np.float32),
        )
    )
    log.close()
    assert list(root.rglob("part-*.parquet")), "the log wrote no part"


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port something listens on: serve stops at its start-up checks (after those of its locations)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


#: What keeps a run short, by command (no server started; Ray is refused below), and what a flag needs beside it.
EXTRA = {
    "backtest": ["--n-windows", "2", "--no-progress"],
    "tune": ["--budget-s", "0.1"],
}
NEEDS = {"covariate_data": ["--covariates", "temperature"]}
#: Flags whose location a run reads before anything else can stop it (every other location it needs is a real
#: one): the run's error line names it, redacted. A case that stopped earlier (a required setting missing, a
#: stand-in file that does not read) would check nothing of the flag.
READ_FIRST = {
    ("score", "--actuals"),
    ("score", "--backtest"),
    ("backtest", "--data"),
    ("backtest", "--covariate-data"),
    ("backtest", "--tuned"),
    ("tune", "--data"),
    ("fev", "benchmark"),
}


def _file_name(dest: str) -> str:
    if "checkpoint" in dest:
        return "m.onnx"
    return {"config": "c.yaml", "tuned": "t.json", "benchmark": "b.yaml"}.get(dest, "d.parquet")


def _arguments(command: str, flag: str, dest: str, value: str, places: dict[str, str], tmp: Path) -> list[str]:
    """The command line: ``flag`` given ``value``, every other required location a harmless one."""
    parser = _subparsers(cli._parser([command]))[command]
    words = [command]
    positional_value = {dest: value}
    for action in parser._actions:
        if action.option_strings or action.dest in ("help",):
            continue
        words.append(positional_value.get(action.dest) or places.get(action.dest) or _plain_value(action))
    source = parser.get_default("settings_cli_source")  # a generated command: its model says what is required
    fields = source.settings_cls.model_fields if source is not None else {}
    for action in parser._actions:
        if not action.option_strings or action.dest == dest:
            continue
        field = fields.get(action.dest)
        if action.required or (field is not None and field.is_required()):
            suffix = ".onnx" if str(action.metavar or "").endswith(".onnx") else ""  # export's MODEL.onnx
            words += [action.option_strings[-1], places.get(action.dest, str(tmp / f"out-{action.dest}{suffix}"))]
    groups = [g for g in parser._mutually_exclusive_groups if g.required]
    for group in groups:
        if not any(a.dest == dest for a in group._group_actions):
            first = group._group_actions[0]
            words += [first.option_strings[-1], places.get(first.dest, str(tmp / first.dest))]
    if flag.startswith("-"):
        words += [flag, value]
    return words + EXTRA.get(command, []) + NEEDS.get(dest, [])


def _no_ray(*args: Any, **kwargs: Any) -> bool:
    from distributed_onnx.errors import RayStartError

    raise RayStartError("no Ray in this test: the run got as far as starting it")


def _plain_value(action: argparse.Action) -> str:
    """A positional that is not a location: the first of its choices, else a family that exports."""
    if action.choices:
        return str(next(iter(action.choices)))
    return "chronos_bolt" if action.dest == "family" else "x"


@pytest.mark.integration  # a run that gets far enough builds ORT sessions (tune measures before it writes)
@pytest.mark.parametrize(("command", "flag", "dest"), FLAGS, ids=[f"{c} {f}" for c, f, _ in FLAGS])
def test_no_command_shows_a_locations_secret(
    command: str,
    flag: str,
    dest: str,
    places: dict[str, str],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where an exit 4 writes its traceback
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.chdir(tmp_path)  # a relative (scheme-less) location lands here, searched too
    monkeypatch.setattr("distributed_onnx.runtime.local_ray.connect", _no_ray)  # a run that gets this far stops
    shown = []
    for value in secret_locations(_file_name(dest)):
        words = _arguments(command, flag, dest, value, places, tmp_path)
        if command == "serve":
            words += ["--port", places["busy_port"]]
        try:
            code = cli.main(words)
        except SystemExit as exc:  # argparse refused the line
            code = int(exc.code or 0)
        printed = capfd.readouterr()
        text = printed.out + printed.err
        assert code != 4, f"{' '.join(words)}: an internal error\n{text}"
        written = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
        # Names below a local folder the user named (the scheme-less location is one) are the command's own.
        given = tmp_path / value if "://" not in value else None
        names = [_below(path, given or tmp_path, tmp_path) for path in tmp_path.rglob("*")]
        for secret in SECRETS:
            assert secret not in text, f"{command} {flag}: {secret} printed\n{text}"
            assert not [path for path, content in written.items() if secret.encode() in content], (command, flag)
            assert not [name for name in names if secret in name], (command, flag, names)
        shown.append(code != 0 or "***" in text)
        if (command, flag) in READ_FIRST:  # the run got as far as this location: its error line names it, or a
            # file below it (``score --backtest``: its summary.json, the query then after the file's name)
            errors = [line for line in text.splitlines() if line.startswith("error: ")]
            named = redact(value).split("?")[0]
            assert errors and named in errors[-1], f"{command} {flag}: did the run read it?\n{text}"
    assert all(shown), f"{command} {flag}: a run with a location that cannot work succeeded: is the flag read?"


def _below(path: Path, given: Path, root: Path) -> str:
    """``path``'s name from the folder the user gave (when it is below it), else from ``root``; the folders the
    user named on the way to it are the user's own."""
    if path in given.parents:
        return ""
    for base in (given, root):
        if path == base or base in path.parents:
            return str(path.relative_to(base))
    return str(path)


@pytest.mark.integration
def test_a_real_backtest_on_file_urls_with_secrets_writes_none_of_them(
    tmp_path: Path, ray_session: None, capfd: pytest.CaptureFixture[str], places: dict[str, str]
) -> None:
    """Outputs written for real: summary.json, run.json, report.html record the locations redacted."""
    output = tmp_path / "run"
    data = f"file://{DATA}?secret_key=a(SeCrEtQs51)'b\""
    words = ["backtest", "--checkpoint", places["checkpoint"], "--data", data, "--actors", "1"]
    words += ["--output", f"file://{output}?token='SeCrEtQt51\"&x=(SeCrEtUi51)", "--n-windows", "2"]
    words += ["--cpus-per-actor", "1", "--no-progress"]
    assert cli.main(words) == 0
    printed = capfd.readouterr()
    written = [path for path in output.rglob("*") if path.is_file()]
    assert {"summary.json", "run.json", "report.html"} <= {path.name for path in written}
    for secret in SECRETS:
        assert secret not in printed.out + printed.err
        assert not [path for path in written if secret.encode() in path.read_bytes()], secret
    assert "secret_key=***" in (output / "summary.json").read_text()


@pytest.mark.integration
def test_fev_shows_no_credential_of_a_tasks_dataset_path(
    tmp_path: Path, ray_session: None, capfd: pytest.CaptureFixture[str], places: dict[str, str]
) -> None:
    """fev names a task after its dataset's folders (``user:SECRET@host/hourly``) and echoes its path in every
    summary: neither reaches summaries.json(l), fev_summary.json, pairs/ (files and folder names) or the error
    line, for a task that runs and one whose data is missing."""
    pytest.importorskip("fev")
    import yaml
    from graphs import write_tiny_chronos2
    from test_fev_benchmark import LEVELS, _tasks

    hourly = Path(_tasks(tmp_path / "datasets")[0].dataset_path)
    secret_dir = tmp_path / "datasets" / "user51:SeCrEtPath51@host" / "hourly"
    secret_dir.mkdir(parents=True)
    hourly.rename(secret_dir / "data.parquet")
    common = {"horizon": 8, "num_windows": 1, "seasonality": 24, "quantile_levels": LEVELS, "eval_metric": "MASE"}
    tasks = [
        {"dataset_path": str(secret_dir / "data.parquet"), **common},
        {"dataset_path": str(tmp_path / "gone" / "AKIA51KEY:SeCrEtUi51@host" / "x" / "data.parquet"), **common},
    ]
    bench = tmp_path / "bench.yaml"
    bench.write_text(yaml.safe_dump({"tasks": tasks}))
    checkpoint = write_tiny_chronos2(tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8)
    output = tmp_path / "out"
    words = ["fev", str(bench), "--checkpoint", str(checkpoint.weights_path), "--output", str(output)]
    assert cli.main([*words, "--actors", "1"]) == 1  # the missing task fails alone
    printed = capfd.readouterr()
    assert (output / "summaries.jsonl").read_text().strip()  # the task with data ran
    written = [path for path in output.rglob("*") if path.is_file()]
    names = [str(path.relative_to(output)) for path in output.rglob("*")]
    for secret in SECRETS:
        assert secret not in printed.out + printed.err, printed.err
        assert not [path for path in written if secret.encode() in path.read_bytes()], secret
        assert not [name for name in names if secret in name], names
    assert "***@host/hourly" in (output / "fev_summary.json").read_text()


@pytest.mark.parametrize(
    ("words", "flag"),
    [
        (["inspect", "URL"], "checkpoint"),
        (["tune", "URL"], "tune's checkpoint"),
        (["backtest", "--checkpoint", "URL", "--output", "out"], "--checkpoint"),
        (["fev", "bench.yaml", "--checkpoint", "URL", "--output", "out"], "--checkpoint"),
        (["export", "chronos_bolt", "--from-pretrained", "URL", "--output", "m.onnx"], "--from-pretrained"),
    ],
)
def test_a_checkpoint_given_as_a_url_is_refused_in_one_line_naming_it_redacted(
    words: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 51: a URL went through ``Path``, which folds ``https://`` into ``https:/``: it no longer looked like
    a URL, and ``Checkpoint weights not found: https:/user:PASSWORD@...`` printed the password. Checkpoints are
    read from local files: a URL is one line (exit 2) naming it redacted and saying what to do."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench.yaml").write_text(f"tasks:\n- dataset_path: {DATA}\n  horizon: 4\n")
    url = "https://user:PASSWORD51@127.0.0.1:1/models/m.onnx?sig=SIG51"
    code = cli.main([url if word == "URL" else word for word in words])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {flag} https://***@127.0.0.1:1/models/m.onnx?sig=*** is a URL"), err
    assert "local" in err and len(err.strip().splitlines()) == 1, err
    assert "PASSWORD51" not in err and "SIG51" not in err


def _misspelt(flag: str) -> str:
    """``--output`` -> ``--otuput``: two letters after the first swapped (argparse takes no unknown prefix of a
    flag for it, and the parser's hint names the flag meant)."""
    name = flag[2:]
    return "--" + name[0] + name[2] + name[1] + name[3:] if len(name) > 2 else f"--{name}x"


def _argparse_lines() -> list[list[str]]:
    """Lines argparse itself refuses, each with a location given where no flag takes it: after an unknown flag,
    after a misspelt location flag (both forms), as a stray value after a list flag, and as the command."""
    lines = []
    for command in _subparsers(cli._parser([])):
        flags = [flag for c, flag, _ in FLAGS if c == command and flag.startswith("--")]
        parser = _subparsers(cli._parser([command]))[command]
        head = [command] + [_plain_value(a) for a in parser._actions if not a.option_strings and a.dest != "help"]
        for value in secret_locations(_file_name("data")):
            lines.append([*head, "--unknown", value])
            for flag in flags:
                lines += [[*head, _misspelt(flag), value], [*head, f"{_misspelt(flag)}={value}"]]
    for value in secret_locations("d.parquet"):
        lines += [["backtest", "--quantiles", "0.1", value], [value]]
    return lines


def test_argparse_refusing_a_line_shows_no_secret_of_the_words_it_quotes(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own errors quote the words it could not take (``unrecognized arguments: --outptu
    s3://KEY:SECRET@b/x``), and the parser's hints repeat them: a location given to a misspelt flag is redacted
    there as anywhere else, while the error still says what was wrong."""
    lines = _argparse_lines()
    assert len(lines) > 40
    for words in lines:
        with pytest.raises(SystemExit) as refused:
            cli.main(words)
        err = capsys.readouterr().err
        assert refused.value.code == 2, (words, err)
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and ("unrecognized arguments: " in errors[0] or "invalid choice" in errors[0]), err
        assert "***" in errors[0], err
        for secret in SECRETS:
            assert secret not in err, (words, err)
        if "--unknown" not in words and "--quantiles" not in words and len(words) > 1:
            assert "hint: did you mean --" in err, err  # the flag meant is named
