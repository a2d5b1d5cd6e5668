"""Issue 29, defect 8: secrets in a storage URL (user-info, options) never leave the URL they came in.

Unit tier for :func:`storage.redact`; integration tier for a backtest and a ``score`` of a forecast log run
on ``file://`` URLs carrying secret options (pyarrow accepts them and reads the path), then every file
either wrote, and what they printed, grepped for the secrets.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from distributed_onnx import storage

SECRETS = ("TOPSECRET-DATA", "TOPSECRET-OUT", "TOPSECRET-ACTUALS", "TOPSECRET-SCORE")


def test_redact_removes_user_info_and_every_option_value() -> None:
    url = "s3://KEY:SECRET@bucket/run?access_key=K1&secret_key=S1&region=eu-west-1&flag"
    assert storage.redact(url) == "s3://***@bucket/run?access_key=***&secret_key=***&region=***&flag"
    assert storage.redact("s3://bucket/run") == "s3://bucket/run"
    assert storage.redact("/data/load.parquet") == "/data/load.parquet"
    assert storage.redact(Path("/a?b=c")) == "/a?b=c"  # a local path is not a URL
    document = {"data": url, "nested": [{"output": "gs://u:p@b/x"}], "n": 3, "plain": "text?x=y"}
    assert storage.redacted(document) == {
        "data": storage.redact(url),
        "nested": [{"output": "gs://***@b/x"}],
        "n": 3,
        "plain": "text?x=y",
    }


#: Credential-bearing URLs of issue 40 (defects 10, 11): user-info, signed-URL options, SAS options, a bare
#: ``?secret_key=``; every secret is unique so a scan can find it anywhere.
CREDENTIAL_URLS = {
    "s3": (
        "s3://AKIAEXAMPLEKEY:SeCrEtVaLuE123@bucket/x.parquet?endpoint_override=127.0.0.1:1&scheme=http",
        ("AKIAEXAMPLEKEY", "SeCrEtVaLuE123"),
    ),
    "https": (
        "https://user:PASSWORD123@127.0.0.1:1/x.parquet?X-Amz-Signature=SIG123abc&X-Amz-Credential=CRED77",
        ("PASSWORD123", "SIG123abc", "CRED77"),
    ),
    "hdfs": ("hdfs://u:HDFSPW42@127.0.0.1:1/x.parquet", ("HDFSPW42",)),
    "s3-option": ("s3://bucket/x.parquet?secret_key=QSECRET9", ("QSECRET9",)),
    "abfs-sas": (
        "abfs://container@account.dfs.core.windows.net/x.parquet?sv=2022&se=2030&sp=r&sig=SASSIG55",
        ("SASSIG55",),
    ),
}


def test_redact_text_finds_every_url_in_free_text() -> None:
    """Issue 40, defect 10: an error message from pyarrow or fsspec, or a log line, may hold a URL anywhere."""
    for url, secrets in CREDENTIAL_URLS.values():
        text = f"Cannot read '{url}': failed (see {url}) and\n\t{url}."
        shown = storage.redact_text(text)
        assert not [secret for secret in secrets if secret in shown], shown
        assert shown.startswith("Cannot read '") and shown.endswith(".")
    assert storage.redact_text("no url here: a=b&c=d") == "no url here: a=b&c=d"
    assert storage.redact("https://h/x?X-AMZ-SIGNATURE=abc#frag") == "https://h/x?X-AMZ-SIGNATURE=***#***"


#: The flags and URLs the CLI test runs: an unreachable S3 or Azure host costs its client's retries (6 to 15 s),
#: so those two run once each; the others fail at once.
CLI_CASES = [
    (flag, name)
    for flag in ("--data", "--covariate-data", "--actuals", "--forecasts", "export --data")
    for name in ("https", "hdfs", "s3-option")
] + [("--covariate-data", "s3"), ("--actuals", "abfs-sas")]


@pytest.mark.parametrize(("flag", "name"), CLI_CASES)
def test_an_error_about_a_credential_url_shows_no_secret(
    name: str, flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, defect 10: each flag that takes a URL, given one with credentials that cannot be read, ends in
    one ``error:`` line (exit 2 or 3, never 4: an ``s3://...?secret_key=`` URL was exit 4 with "install s3fs"
    and a traceback file that held the secret) with no secret in it, nor in any file the command wrote."""
    from distributed_onnx.cli import main

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where an exit 4 would write its traceback
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    url, secrets = CREDENTIAL_URLS[name]
    data = Path(__file__).parents[1] / "distributed_onnx" / "resources" / "taylor.parquet"
    log = tmp_path / "log"
    (log / "day=2026-12-01").mkdir(parents=True)
    output = str(tmp_path / "out")
    if flag in {"--data", "--covariate-data"}:
        arguments = ["backtest", "--data", str(data), "--output", output, "--n-windows", "2", "--no-progress"]
        arguments += ["--actors", "1", "--address", "127.0.0.1:1"]  # never reached: the data is read first
        if flag == "--data":
            arguments[2] = url
        else:
            arguments += ["--covariate-data", url, "--covariates", "temperature"]
    elif flag == "export --data":  # the data is read before the model loads: the folder need not hold one
        arguments = ["export", "chronos_bolt", "--from-pretrained", str(tmp_path), "--output", f"{output}.onnx"]
        arguments += ["--data", url]
    elif flag in {"--actuals", "--forecasts"}:
        arguments = ["score", "--forecasts", str(log), "--actuals", str(data), "--output", output]
        arguments[arguments.index(flag) + 1] = url
    else:
        raise AssertionError(flag)
    code = main(arguments)
    printed = capsys.readouterr()
    assert code in (2, 3), (code, printed.err)
    assert [line for line in printed.err.splitlines() if line.startswith("error:")] == [printed.err.strip()]
    assert "Traceback" not in printed.err
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    for secret in secrets:
        assert secret not in printed.out + printed.err, printed.err
        assert not [path for path in written if secret.encode() in path.read_bytes()]


@pytest.mark.integration
def test_no_output_file_nor_printed_line_carries_a_urls_secrets(
    tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from backtest_data import settings_for, write_dataset
    from graphs import write_tiny_chronos2

    from distributed_onnx.cli import main

    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    checkpoint = write_tiny_chronos2(tmp_path / "models").weights_path
    backtest = tmp_path / "backtest"
    settings = settings_for(checkpoint, data, backtest, actors=1, n_windows=2)
    arguments = ["backtest", "--checkpoint", str(checkpoint), "--data", f"file://{data}?secret_key={SECRETS[0]}"]
    arguments += ["--output", f"file://{backtest}?access_key={SECRETS[1]}", "--actors", "1", "--n-windows", "2"]
    arguments += ["--stride", str(settings.stride), "--cpus-per-actor", "1", "--no-progress"]
    assert main(arguments) == 0
    log = tmp_path / "log"
    (log / "day=2026-12-01").mkdir(parents=True)  # an empty log: refused in one line (exit 2), which must not leak
    score = tmp_path / "score"
    arguments = ["score", "--forecasts", str(log), "--actuals", f"file://{data}?secret_key={SECRETS[2]}"]
    arguments += ["--output", f"file://{score}?session_token={SECRETS[3]}", "--backtest", str(backtest)]
    assert main(arguments) == 2
    printed = capsys.readouterr()
    written = [path for folder in (backtest, score) if folder.exists() for path in folder.rglob("*") if path.is_file()]
    assert {"summary.json", "run.json", "report.html"} <= {path.name for path in written}
    for secret in SECRETS:
        assert secret not in printed.out and secret not in printed.err
        leaked = [str(path) for path in written if secret.encode() in path.read_bytes()]
        assert not leaked, f"{secret} in {leaked}"
    assert "secret_key=***" in (backtest / "summary.json").read_text()  # redacted, not dropped


@pytest.mark.integration
def test_a_local_output_named_as_a_url_is_written_there_and_shown_masked(
    tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--output './s3:/u:pw@b/x?t=T#F'`` is a local folder (as the docs say), and the run printed ``wrote
    ./s3:/***@b/x?t=T#F`` and recorded that in summary.json, run.json and report.html (attack I): the user-info
    masked, the option and fragment of the same text shown. Now all of them are masked wherever it is shown, and
    the folder is still written where the user said."""
    from backtest_data import settings_for, write_dataset
    from graphs import write_tiny_chronos2

    from distributed_onnx.cli import main

    monkeypatch.chdir(tmp_path)
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    checkpoint = write_tiny_chronos2(tmp_path / "models").weights_path
    output = "./s3:/usr9q:PWSECRET9@b/x?tok=TOKSECRET9#FRAGSECRET9"
    settings = settings_for(checkpoint, data, tmp_path / "unused", actors=1, n_windows=2)
    arguments = ["backtest", "--checkpoint", str(checkpoint), "--data", str(data), "--output", output]
    arguments += ["--actors", "1", "--n-windows", "2", "--stride", str(settings.stride), "--cpus-per-actor", "1"]
    assert main([*arguments, "--no-progress"]) == 0
    printed = capsys.readouterr()
    folder = tmp_path / output
    written = {path.name: path.read_text(errors="replace") for path in folder.rglob("*") if path.is_file()}
    assert {"summary.json", "run.json", "report.html"} <= set(written)
    assert "wrote ./s3:/***@b/x?tok=***#***" in printed.out, printed.out
    assert "./s3:/***@b/x?tok=***#***" in written["summary.json"]
    for secret in ("PWSECRET9", "TOKSECRET9", "FRAGSECRET9"):
        assert secret not in printed.out + printed.err
        assert not [name for name, text in written.items() if secret in text], secret


@pytest.mark.integration
def test_serve_with_a_credential_log_url_shows_no_secret_anywhere(tmp_path: Path) -> None:
    """Issue 40, defect 11: ``serve --forecast-log URL`` printed the URL whole in its ``ready:`` line and log.

    ``serve`` runs (start, one forecast, the pages a client reads: /docs' OpenAPI, /metrics, then stop) with a
    ``file://`` log URL carrying a secret option (pyarrow reads the path and takes the option); everything it
    printed, answered and wrote (the log folder, recursively, bytes included) is scanned for the secret.
    """
    import httpx
    from graphs import write_tiny_context_quantiles
    from test_serve_ingress import Server

    secret = "SERVE-SECRET-4f1c"
    checkpoint = write_tiny_context_quantiles(tmp_path / "models").weights_path
    log = tmp_path / "log"
    server = Server(
        *("--checkpoint", str(checkpoint), "--forecast-log", f"file://{log}?session_token={secret}"),
        *("--forecast-log-flush-s", "0.2", "--cpus-per-replica", "1", "--warm-up-rows", "0"),
    )
    answered = []
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"series": [{"series_id": "a", "y": [1.0] * 16, "start": "2026-12-01T00:00:00Z"}], "horizon": 4}
            response = client.post("/v1/forecast", json=body)
            assert response.status_code == 200, response.text
            answered += [response.text]
            answered += [client.get(page).text for page in ("/openapi.json", "/metrics", "/docs", "/v2/models")]
            for _ in range(100):  # the log's flush (0.2 s), then its file
                if any(path.suffix == ".parquet" for path in log.rglob("*")):
                    break
                time.sleep(0.1)
    finally:
        printed = server.stop()
    assert "ready:" in printed and "session_token=***" in printed, printed[-2000:]
    written = [path for path in log.rglob("*") if path.is_file()]
    assert any(path.suffix == ".parquet" for path in written), written  # the URL was used, not only shown
    assert secret not in printed, [line for line in printed.splitlines() if secret in line]
    assert not [text for text in answered if secret in text]
    assert not [str(path) for path in written if secret.encode() in path.read_bytes()]


def test_every_error_of_the_package_carries_no_url_secret() -> None:
    """Issue 40, defect 10: a message built from a URL anywhere (an actor's StorageError, a DataError about
    ``--covariate-data``) is redacted where the error is made, so no log line or pickled error carries it."""
    import pickle

    from distributed_onnx.errors import DataError, StorageError

    for url, secrets in CREDENTIAL_URLS.values():
        for error in (StorageError(f"Cannot write {url}: refused", path="p"), DataError(f"{url}: no rows")):
            shown = [str(error), repr(error), str(pickle.loads(pickle.dumps(error)))]
            assert not [secret for secret in secrets for text in shown if secret in text], shown


def test_redaction_takes_urls_with_parentheses_and_quotes_whole_and_bare_user_info() -> None:
    """Issue 51: the redaction stopped at ``(``, ``)`` and ``'``, which URLs may hold, and knew no user-info
    without a scheme (fev's default task name ``user:secret@host/dir``)."""
    cases = {
        "https://h/sales(2024).parquet?sig=SECRET1": "https://h/sales(2024).parquet?sig=***",
        "s3://KEY:pa(SECRET2)word@bucket/x": "s3://***@bucket/x",
        "error: 's3://KEY:pa'SECRET3\"@bucket/x': refused": "error: 's3://***@bucket/x': refused",
        "(see https://h/a(1).csv?sig=SECRET4).": "(see https://h/a(1).csv?sig=***).",
        "task user:SECRET5@host/dir failed": "task ***@host/dir failed",
        "(s3://, gs://, abfs://...)": "(s3://, gs://, abfs://...)",  # nothing to mask: as written
    }
    for text, shown in cases.items():
        assert storage.redact_text(text) == shown
    assert storage.redact("user:SECRET6@host/dir") == "***@host/dir"


def test_url_like_text_inside_a_path_has_its_options_masked_wherever_its_user_info_is() -> None:
    """Attack I: text that looks like a URL but does not start the path (``./s3:/...``, ``-s3://...``, ``(s3://...)``,
    a folder ``out dir/s3://...``, ``s3 ://...``) had its user-info masked and its options and fragment shown. One
    rule now, for a location and for any text: where the user-info is masked, its options and fragment are too;
    a path with no URL-like text is shown as written."""
    from distributed_onnx.location import Location

    cases = {
        "./s3:/u:pw7@b/x?t=T0K#F12": "./s3:/***@b/x?t=***#***",
        "(s3://u:pw7@b/x?t=T0K)": "(s3:/***@b/x?t=***)",
        "x(s3://u:pw7@b/x?t=T0K)": "x(s3:/***@b/x?t=***)",
        "-s3://u:pw7@b/x?t=T0K": "-s3:/***@b/x?t=***",
        "out dir/s3://u:pw7@b/x?t=T0K#F12": "out dir/s3:/***@b/x?t=***#***",
        "s3 ://u:pw7@b/x?t=T0K": "s3 :/***@b/x?t=***",
        "data/a?b.csv": "data/a?b.csv",
        "runs/T12:30:00": "runs/T12:30:00",
    }
    for written, shown in cases.items():
        assert str(Location.parse(written)) == shown, written
    quoted = "No such file or directory: '/tmp/a/s3:/u:pw7@b/x.yaml?t=T0K#F12'."
    assert storage.redact_text(quoted) == "No such file or directory: '/tmp/a/s3:/***@b/x.yaml?t=***#***'."
    location = Location.parse("./s3:/usr9:PWSECRET9@b/x?tok=TOKSECRET9")  # remembered, as a URL's secrets are
    assert storage.redact_text("PWSECRET9 and TOKSECRET9 quoted alone") == "*** and *** quoted alone", location
