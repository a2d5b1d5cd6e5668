"""Issue 29, defect 8: secrets in a storage URL (user-info, options) never leave the URL they came in.

Unit tier for :func:`storage.redact`; integration tier for a backtest and a ``score`` of a forecast log run
on ``file://`` URLs carrying secret options (pyarrow accepts them and reads the path), then every file
either wrote, and what they printed, grepped for the secrets.
"""

from __future__ import annotations

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
