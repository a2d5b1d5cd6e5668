"""Every command's exit path prints a line that says something: no ``error:`` alone (pure logic, no Ray).

Ctrl-C under ``backtest`` printed ``error: `` and nothing else: ``KeyboardInterrupt()`` has no words, and the exit
path took the exception itself (always true) for its words. The commands share one exit path
(``cli.main``); this drives it for each command with the exceptions that carry no words.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

import pytest

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError, RayLostError

WORDLESS = (KeyboardInterrupt(), KeyboardInterrupt("  "), OSError(), ValueError(), MemoryError(), ConfigError(""))


@pytest.mark.parametrize("command", [each.name for each in cli.COMMANDS])
def test_no_command_ends_with_an_empty_error_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for raised in (*WORDLESS, RayLostError("the Ray went away")):

        def handler(args: argparse.Namespace, raised: BaseException = raised) -> NoReturn:
            raise raised

        namespace = argparse.Namespace(command=command, handler=handler, verbose=False)
        monkeypatch.setattr(cli, "parse_words", lambda parser, words, namespace=namespace: namespace)
        code = cli.main([command])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and lines[0].removeprefix("error:").strip(), (command, raised, lines)
        if isinstance(raised, KeyboardInterrupt):
            assert code == cli.EXIT_INTERRUPTED
            resumes = command in cli.RESUMING_COMMANDS
            assert lines[0] == "error: interrupted" + ("; rerun the same command to resume" if resumes else "")
