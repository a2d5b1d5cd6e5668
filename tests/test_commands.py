"""Issue 51, design 2: every command generated from its settings model; run-wide checks done once, before Ray; hints
from the running command's own flags.

Two kinds of test. The defects as a user met them, each through ``cli.main`` (in-process, with the step that
starts Ray, an export or a run replaced by :class:`Reached`, so a refusal that comes too late fails loudly instead
of running). And the classes, enumerated rather than listed, so that a new command, flag or message is covered
without editing this file:

- every command and every flag of ``cli._parser()``: a bad value of the flag's type is exit 2 with one ``error:``
  line naming the flag, before anything runs (:func:`test_every_flag_of_every_command_refuses_a_bad_value`);
- every name a command takes (checkpoint stems, export's output) by one rule, the same line everywhere;
- every flag a message can name (the literals of each module a command imports, and the suggestions an error
  carries) exists on each command that can print it.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import typing
from collections.abc import Iterator
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from backtest_data import write_dataset
from graphs import write_tiny_chronos2

from distributed_onnx import cli, names
from distributed_onnx.errors import ConfigError, DataError, Suggestion

PACKAGE = Path(cli.__file__).parent


class Reached(BaseException):
    """Raised where a command would start Ray, an export or its run: not an ``Exception``, so ``cli.main`` does
    not turn it into an exit code."""


#: Where each command starts its work: (module, attribute) replaced by :class:`Reached`.
RUNS = {
    "inspect": ("distributed_onnx.model.inspection", "inspect_checkpoints"),
    "export": ("distributed_onnx.export", "run_export"),
    "fev": ("distributed_onnx.evaluation.fev_tasks.runner", "run_benchmark"),
    "tune": ("distributed_onnx.tune", "run_tune"),
    "backtest": ("distributed_onnx.evaluation.driver.early", "start_early"),
    "serve": ("distributed_onnx.serve.runner", "serve_forever"),
    "score": ("distributed_onnx.live.score.folders", "prepare_score"),
}


def _stop_at(monkeypatch: pytest.MonkeyPatch, module: str, attribute: str) -> None:
    def reached(*args: Any, **kwargs: Any) -> Any:
        raise Reached(f"{module}.{attribute}")

    monkeypatch.setattr(f"{module}.{attribute}", reached)


@pytest.fixture
def stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command stops where its work (and Ray) would start; fev also where it would join Ray."""
    for module, attribute in RUNS.values():
        _stop_at(monkeypatch, module, attribute)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("commands")
    tiny = write_tiny_chronos2(root / "models", name="tiny", context_length=64, output_patch_size=8, horizon_patches=3)
    made = {"tiny": tiny.weights_path, "models": root / "models", "data": write_dataset(root / "load.parquet")}
    made["a-file"] = root / "a-file.txt"
    made["a-file"].write_text("not a folder")
    made["root"] = root
    return made


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = _error_lines(capsys)
    assert len(lines) == 1, lines
    return lines[0]


# --- the walk: every command, every flag, a bad value each --------------------------------------------------------


def _base(command: str, files: dict[str, Path], tmp_path: Path) -> list[str]:
    """A valid command line of ``command``: what it needs besides the flag under test (one run reaches its work)."""
    return {
        "inspect": [command, str(files["tiny"])],
        "export": [command, "chronos_bolt", "--random-weights", "--output", str(tmp_path / "m.onnx")],
        "fev": [command, str(tmp_path / "bench.yaml"), "--output", str(tmp_path / "fev")],
        "tune": [command, str(files["tiny"])],
        "backtest": [
            command,
            "--checkpoint",
            str(files["tiny"]),
            "--data",
            str(files["data"]),
            "--output",
            str(tmp_path / "run"),
        ],
        "serve": [command, "--checkpoint", str(files["tiny"])],
        "score": [
            command,
            "--forecasts",
            str(tmp_path / "log"),
            "--actuals",
            str(files["data"]),
            "--output",
            str(tmp_path / "scores"),
        ],
    }[command]


def _commands() -> list[str]:
    action = next(a for a in cli._parser([])._actions if a.__class__.__name__ == "_SubParsersAction")
    return list(action.choices)


def _command_parser(command: str) -> Any:
    parser = cli._parser([command])
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices[command]


def _arguments(command: str) -> Iterator[tuple[Any, Any]]:
    """Each argument of ``command`` that takes a value or is a switch, with its settings field (None for the
    command's own: ``--config``, ``--tuned``)."""
    from distributed_onnx.settings_sources import settings_model

    parser = _command_parser(command)
    model = settings_model(parser.parse_known_args(_minimal(command))[0])
    for action in parser._actions:
        if action.dest in ("help", "settings_cli_source"):
            continue
        yield action, model.model_fields.get(action.dest)


def _minimal(command: str) -> list[str]:
    """Enough words for argparse to fill a namespace (positional arguments), to find the command's model."""
    return ["x"] if command in ("inspect", "export", "fev", "tune") else []


def _members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, __import__("types").UnionType):
        return [member for arg in typing.get_args(annotation) for member in _members(arg) if member is not type(None)]
    return [annotation]


def _bad_values(action: Any, field: Any) -> list[str]:
    """Values of the argument's type that its command must refuse: out of bounds (negative, huge), non-finite, not
    a number, empty, not a choice, a path where a name goes."""
    if action.nargs == 0:  # a switch: a value given to it
        return ["=maybe"]
    if field is None:  # the command's own file arguments (--config, --tuned)
        return [""]
    kinds = _members(field.annotation)
    bounds = {type(item).__name__: item for item in field.metadata}
    values: list[str] = []
    if int in kinds or float in kinds:
        low = bounds.get("Gt") or bounds.get("Ge")
        high = bounds.get("Le") or bounds.get("Lt")
        if low is not None:
            values.append(str(getattr(low, "gt", getattr(low, "ge", 0)) - 1))
        if high is not None:
            values.append(str(int(getattr(high, "le", getattr(high, "lt", 0))) * 10 + 10))
        values += ["nan", "inf", "-inf"] if float in kinds else ["1.5"]  # -inf: a value, not a flag
        values.append("many")
    elif any(typing.get_origin(kind) is typing.Literal for kind in kinds) or any(
        isinstance(kind, type) and issubclass(kind, Enum) for kind in kinds
    ):
        values.append("bogus")
    elif datetime in kinds:
        values.append("not-a-date")
    elif any(typing.get_origin(kind) is list for kind in kinds):
        inner = _members(typing.get_args(kinds[0])[0]) if typing.get_origin(kinds[0]) is list else []
        if float in inner:
            values += ["2", "nan"]
        elif Path in inner:
            values.append("")
        else:  # names: one given twice (a path where a name goes: test_every_command_refuses_the_same_names...)
            values.append("a,a")
    else:  # a path, a URL, a name, an address: empty
        values.append("")
    return values


def _named(line: str, action: Any) -> bool:
    """Whether the error line names the argument: a flag as typed, a positional argument's name, or its setting
    (``Config file ...`` for ``--config``)."""
    words = [*action.option_strings, action.metavar or ""]
    return any(word and word in line for word in words) or action.dest.replace("_", " ") in line.lower()


def _walk_cases() -> list[tuple[str, str, str]]:
    cases = []
    for command in _commands():
        for action, field in _arguments(command):
            flag = action.option_strings[0] if action.option_strings else action.dest
            if flag in ("-v", "--verbose", "--version"):
                continue
            cases += [(command, flag, value) for value in _bad_values(action, field)]
    return cases


def test_every_command_is_generated_and_reaches_its_work_from_a_valid_line(
    stopped: None, files: dict[str, Path], tmp_path: Path
) -> None:
    assert sorted(_commands()) == sorted(RUNS)  # a new command: add where it starts its work to RUNS
    for command in _commands():
        with pytest.raises(Reached):
            cli.main(_base(command, files, tmp_path))


def test_every_flag_of_every_command_refuses_a_bad_value(
    stopped: None,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each bad value: exit 2, one ``error:`` line naming the argument, no traceback, nothing run (a value taken
    reaches :class:`Reached` and fails here with the flag and the value)."""
    built: dict[str | None, Any] = {}
    make = cli._parser

    def parser_once(argv: Any = None) -> Any:  # the same parser for every line of a command: it is the slow part
        command = cli.command_given(argv or [])
        if command not in built:
            built[command] = make(argv)
        return built[command]

    monkeypatch.setattr(cli, "_parser", parser_once)
    failures = []
    parsers = {command: {a.dest: a for a, _ in _arguments(command)} for command in _commands()}
    cases = _walk_cases()
    assert len(cases) > 150, len(cases)  # every command's flags, several values each
    for command, flag, value in cases:
        action = next(a for a in parsers[command].values() if flag in (*a.option_strings, a.dest))
        base = _base(command, files, tmp_path)
        if action.option_strings:
            given = [f"{flag}{value}"] if value.startswith("=") else [flag, value]
            argv = [*_without(base, flag), *given]
        else:  # a positional argument: in its place
            argv = [value if word == _positional_of(command, base) else word for word in base]
        try:
            code = cli.main(argv)
        except SystemExit as exit_:  # argparse's own refusal (a switch given a value, a choice not offered)
            code = exit_.code
        except Reached:
            failures.append(f"{command} {flag} {value!r}: taken, the command went on to run")
            capsys.readouterr()
            continue
        err_lines = _error_lines(capsys)
        if code != 2 or len(err_lines) != 1 or not _named(err_lines[0], action):
            failures.append(f"{command} {flag} {value!r}: exit {code}, {err_lines}")
        elif value in ("nan", "inf") and "finite number" not in err_lines[0]:  # not "less than or equal to 4096"
            failures.append(f"{command} {flag} {value!r}: not refused as non-finite: {err_lines}")
    assert not failures, "\n".join(failures)


def _without(words: list[str], flag: str) -> list[str]:
    """``words`` less ``flag`` and its value (so the flag under test is given once)."""
    if flag not in words:
        return words
    at = words.index(flag)
    return words[:at] + words[at + 2 :]


def _positional_of(command: str, base: list[str]) -> str:
    return base[1]


# --- one names rule everywhere ------------------------------------------------------------------------------------

#: File stems the names rule refuses, each with the words of the part it breaks.
REFUSED_STEMS = {
    "-rf": "starts with '-'",
    "..": "starts with '.'",
    "x" * 90: "90 bytes long",
    "seasonal_naive": "a baseline's name",
    "a b": "a space",
    "p%2e": "'%'",
}


@pytest.mark.parametrize("stem", list(REFUSED_STEMS), ids=["dash", "dots", "long", "baseline", "space", "percent"])
def test_every_command_refuses_the_same_names_by_the_part_of_the_rule_they_break(
    stem: str, stopped: None, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 51: ``backtest`` refused ``-rf`` naming rules it meets ("letters, digits, '.', '_' or '-'"), 90
    letters the same way (not "80 bytes"); ``export`` wrote both (exit 0), and ``..onnx`` as hidden files; ``fev``
    turned them into failed pairs after starting Ray. Now each command refuses each the same way, before anything
    runs: exit 2, one line naming the part of the rule broken."""
    monkeypatch.undo()  # the real fev runner, up to where it would join Ray
    _stop_at(monkeypatch, "distributed_onnx.evaluation.fev_tasks.runner", "_join_ray")
    for module, attribute in RUNS.values():
        if attribute != "run_benchmark":
            _stop_at(monkeypatch, module, attribute)
    checkpoint = str(tmp_path / f"{stem}.onnx")
    bench = tmp_path / "bench.yaml"
    bench.write_text("tasks: []\n")
    lines = {
        "backtest": ["backtest", "--checkpoint", checkpoint, "--data", str(files["data"]), "--output", str(tmp_path)],
        "fev": ["fev", str(bench), "--checkpoint", checkpoint, "--output", str(tmp_path / "fev")],
        "serve": ["serve", "--checkpoint", checkpoint],
        "export": ["export", "chronos_bolt", "--random-weights", "--output", checkpoint],
    }
    for command, argv in lines.items():
        assert cli.main(argv) == 2, command
        line = _one_error(capsys)
        assert names.name_problem(stem) in line and REFUSED_STEMS[stem] in line, (command, line)
        assert "letters, digits, '.', '_' or '-' and not" not in line  # the rules it meets are not listed
    assert list(tmp_path.iterdir()) == [bench]  # nothing written by any of them


# --- hints name only flags the command has ---------------------------------------------------------------------


def _package_modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports anywhere (a function's lazy import too), with their parents."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names_: list[str] = []
        if isinstance(node, ast.Import):
            names_ = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names_ = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names_:
            parts = name.split(".")
            found |= {".".join(parts[:end]) for end in range(2, len(parts) + 1) if ".".join(parts[:end]) in modules}
    return found


def _handler_roots(command: str, modules: dict[str, Path]) -> set[str]:
    """The modules a command's handler and its settings model import (from the handler's module's source)."""
    entry = next(each for each in cli.COMMANDS if each.name == command)
    tree = ast.parse(Path(inspect.getsourcefile(entry.handler) or "").read_text())
    handler = next(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == entry.handler.__name__
    )
    roots: set[str] = set()
    for node in ast.walk(handler):
        if isinstance(node, ast.ImportFrom) and node.module:
            roots |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in modules}
    roots.add(entry.settings().__module__)
    return roots


def _reached(command: str, modules: dict[str, Path], graph: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(_handler_roots(command, modules))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += graph.get(name, set())
    return seen - {"distributed_onnx.cli", "distributed_onnx.cli_words"}


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]")
#: Another command named in the same text: ``distributed-onnx export ... --horizon`` is export's flag.
_OTHER_COMMAND = re.compile(r"distributed-onnx (\w+)")
#: Other programs' flags a message may name (pip, the hub's downloader, upstream's exporter, Ray's own command line).
_NOT_OURS = {"--no-deps", "--local-dir", "--no_future_covariates", "--head", "--node-ip-address", "--help"} | {
    # The raylet's and its agents' own command lines (runtime/ray_private.py, running_ray.py read and rewrite them).
    "--dashboard_agent_command",
    "--runtime_env_agent_command",
    "--node-id",
    "--node_id",
    "--session-dir",
    "--session-name",
    "--ports",
}


def _texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each string a module can show: constants and f-strings (their pieces joined, ``{}`` for each value),
    docstrings and help texts (a field's ``description``, ``help=``, an ``add_argument`` call) left out."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            skipped.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg in ("description", "help"):
            skipped |= {id(each) for each in ast.walk(node.value)}
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            skipped |= {id(each) for each in ast.walk(node)}
        if isinstance(node, ast.JoinedStr) and id(node) not in skipped:
            skipped |= {id(each) for each in node.values}
            pieces = [each.value if isinstance(each, ast.Constant) else "{}" for each in node.values]
            yield node.lineno, "".join(str(piece) for piece in pieces)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value


def _message_flags(path: Path) -> list[tuple[int, str, str | None]]:
    """The ``--flags`` a module's messages name: (line, flag, the other command it is named with, if any)."""
    found = []
    for line, text in _texts(ast.parse(path.read_text())):
        for match in _FLAG.finditer(text):
            if match.group() in _NOT_OURS:
                continue
            other = [each.group(1) for each in _OTHER_COMMAND.finditer(text[: match.start()])]
            found.append((line, match.group(), other[-1] if other else None))
    return found


def test_a_message_names_only_flags_of_every_command_that_can_print_it() -> None:
    """Issue 51: ``tune`` and ``export`` suggested ``--id-col`` (the data layer's words), ``fev`` suggested
    ``--clamp-quantiles``: flags they did not have. Every flag a module's messages spell out must be a flag of
    every command whose code imports the module (or of the command the text names with it, ``distributed-onnx
    export ... --horizon``); a message that reaches commands with different flags names the setting in a
    :class:`~distributed_onnx.errors.Suggestion`, which each command renders with its own flags."""
    modules = _package_modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    flags = {}
    for command in _commands():
        own = set(cli.command_flags(cli._parser([command]), command).values())
        flags[command] = own | {"--no-" + flag[2:] for flag in own}
    said = {name: _message_flags(path) for name, path in modules.items()}
    wrong = []
    for command in _commands():
        for module in sorted(_reached(command, modules, graph)):
            for line, flag, other in said[module]:
                if flag not in flags[other or command]:
                    where = modules[module].relative_to(PACKAGE.parent)
                    wrong.append(f"{where}:{line}: {flag} ({other or command} has none)")
    assert not wrong, "\n".join(sorted(set(wrong)))


def _suggestions() -> list[Suggestion]:
    """Every suggestion an error can carry: the module-level ones and those the data layer builds."""
    from distributed_onnx.evaluation import up_front
    from distributed_onnx.evaluation.data.columns import _OTHER_NAMES, suggestion_for
    from distributed_onnx.runtime.pool_room import RAISE_READY_TIMEOUT, ActorShape, Asked

    found = [value for value in vars(up_front).values() if isinstance(value, Suggestion)]
    others = [name for names_ in _OTHER_NAMES.values() for name in names_]
    built = suggestion_for(["series_id", "timestamp", "y"], others)
    assert built is not None
    pool = Asked(2, ActorShape(1, 0))
    return [*found, built, RAISE_READY_TIMEOUT, pool.lower(), pool.lower("Lower {} or add nodes.", separator="/")]


def _suggested_settings() -> dict[str, str]:
    """Every setting a ``Suggestion(...)`` in the package names where it spells the setting out (a literal, or a
    module constant of literals): setting -> where."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Suggestion" and len(node.args) > 1):
                continue
            settings = node.args[1]
            settings = constants.get(settings.id, settings) if isinstance(settings, ast.Name) else settings
            for pair in getattr(settings, "elts", []):
                first = pair.elts[0] if isinstance(pair, ast.Tuple) else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found[first.value] = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
    return found


def test_every_setting_a_suggestion_names_is_a_flag_of_some_command() -> None:
    """A suggestion naming no command's setting (a typo, a field renamed) would never be shown anywhere."""
    suggested = _suggested_settings()
    assert {"clamp_quantiles", "context_length", "group_by", "covariate_data", "ready_timeout_s"} <= set(suggested)
    every = set().union(*(cli.command_flags(cli._parser([c]), c) for c in _commands()))
    assert not {name: where for name, where in suggested.items() if name not in every}


def test_a_suggestion_is_shown_only_by_a_command_that_has_every_flag_it_names() -> None:
    for command in _commands():
        flags = cli.command_flags(cli._parser([command]), command)
        for suggestion in _suggestions():
            error = ConfigError("a problem.", suggestions=(suggestion,))
            shown = error.render(flags)
            present = [name for name in suggestion.names if name in flags]
            if present == list(suggestion.names) or (suggestion.partial and present):
                assert all(flags[name] in shown for name in present), (command, shown)
            else:
                assert shown == "a problem.", (command, shown)
            assert set(_FLAG.findall(shown)) <= set(flags.values()), (command, shown)


# --- the defects as met -----------------------------------------------------------------------------------------


@pytest.fixture
def fev_files(tmp_path: Path) -> dict[str, Path]:
    """A fev dataset and benchmarks of one task each (and none), in fev's own format."""
    fev = pytest.importorskip("fev")  # noqa: F841 - the extra, or skip
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    n = 120
    stamps = list(pd.date_range("2021-03-01", periods=n, freq="h").to_pydatetime())
    data = tmp_path / "fevdata" / "data.parquet"
    data.parent.mkdir()
    table = {
        "id": ["a", "b"],
        "timestamp": pa.array([stamps, stamps], pa.list_(pa.timestamp("ms"))),
        "target": [list(np.sin(np.arange(n))), list(np.cos(np.arange(n)))],
    }
    pq.write_table(pa.table(table), data)
    task = {"dataset_path": str(data), "horizon": 8, "num_windows": 1}
    benchmarks = {
        "levels": [task | {"task_name": "wide", "quantile_levels": [0.01, 0.5, 0.99]}],
        "season0": [task | {"task_name": "s0", "seasonality": 0}],
        "empty": [],
    }
    made = {}
    for name, tasks in benchmarks.items():
        made[name] = tmp_path / f"{name}.yaml"
        made[name].write_text(yaml.safe_dump({"tasks": tasks}))
    return made


def test_fev_refuses_up_front_what_the_backtest_refuses_and_skips_a_pair_it_cannot_serve(
    files: dict[str, Path],
    fev_files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 51: a task with ``seasonality: 0``, a checkpoint name the backtest refuses and quantile levels beyond the
    graph's range became "failed" pairs after Ray started, exit 1, "rerun to retry" (a rerun failed the same way),
    the hint naming --clamp-quantiles, which fev did not take; ``tasks: []`` exited 0 with empty summaries; an
    ``--output`` that is a file exited 3. Now: refused before Ray (exit 2, one line naming the task or the
    checkpoint and the rule), or, for levels a checkpoint cannot forecast, skipped with the reason (what
    docs/fev.md says), and ``--clamp-quantiles`` is fev's flag too."""
    _stop_at(monkeypatch, "distributed_onnx.evaluation.fev_tasks.runner", "_join_ray")
    tiny = str(files["tiny"])

    def fev(bench: Path, output: Path, *extra: str) -> int:
        return cli.main(["fev", str(bench), "--checkpoint", tiny, "--output", str(output), *extra])

    assert fev(fev_files["season0"], tmp_path / "s0") == 2
    line = _one_error(capsys)
    assert "seasonality" in line and "greater than 0" in line and "fev task 's0'" in line, line

    assert fev(fev_files["empty"], tmp_path / "empty") == 2
    assert "holds no task" in _one_error(capsys)

    assert fev(fev_files["levels"], files["a-file"]) == 2
    assert f"--output {files['a-file']} is a file" in _one_error(capsys)
    assert not (tmp_path / "s0").exists() and not (tmp_path / "empty").exists()

    assert fev(fev_files["levels"], tmp_path / "levels") == 0  # skipped: no run, no Ray
    out = capsys.readouterr().out
    pairs = json.loads((tmp_path / "levels" / "fev_summary.json").read_text())["pairs"]
    assert [p["status"] for p in pairs] == ["skipped"]
    assert "0.01, 0.99 lie outside tiny's native range 0.1..0.9" in pairs[0]["reason"]
    assert "--clamp-quantiles" in pairs[0]["reason"] and '"skipped": 1' in out
    assert "--clamp-quantiles" in cli.command_flags(cli._parser(["fev"]), "fev").values()


def test_backtest_refuses_run_wide_settings_before_ray_starts(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names, levels beyond the range and an output that is a file were refused after Ray had started early (the
    plan runs beside Ray's start-up). Now before: the Ray start is replaced by :class:`Reached`."""
    _stop_at(monkeypatch, *RUNS["backtest"])
    named = write_tiny_chronos2(tmp_path / "m", name="x" * 90).weights_path
    base = ["backtest", "--data", str(files["data"]), "--output", str(tmp_path / "run")]
    assert cli.main([*base, "--checkpoint", str(named)]) == 2
    assert "is 90 bytes long; a name is at most 80 bytes" in _one_error(capsys)
    assert cli.main([*base, "--checkpoint", str(files["tiny"]), "--quantiles", "0.01,0.5"]) == 2
    line = _one_error(capsys)
    assert "0.01 lie outside tiny's native range" in line and "give --clamp-quantiles to forecast" in line, line
    assert cli.main([*base[:-1], str(files["a-file"]), "--checkpoint", str(files["tiny"])]) == 2
    assert "is a file" in _one_error(capsys)


def test_a_url_refused_says_whether_the_flag_reads_or_writes_it(
    stopped: None, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export --output s3://...`` was refused as "read from a local file": it is the file export writes."""
    assert cli.main(["export", "chronos_bolt", "--random-weights", "--output", "s3://K:S@b/m.onnx"]) == 2
    line = _one_error(capsys)
    assert "--output s3://***@b/m.onnx is a URL, but it is written to a local file" in line, line
    assert cli.main(["inspect", "https://u:PASSWORD@h/m.onnx"]) == 2
    assert "is a URL, but it is read from a local file" in _one_error(capsys)


def test_tune_and_export_do_not_suggest_flags_they_lack(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table in Nixtla's names: ``backtest`` suggests ``--id-col unique_id``; ``tune`` and ``export`` have no such
    flag and said the same. Now they name the missing columns only."""
    import pyarrow.parquet as pq

    table = pq.read_table(files["data"])
    nixtla = tmp_path / "nixtla.parquet"
    pq.write_table(table.rename_columns(["unique_id" if c == "series_id" else c for c in table.column_names]), nixtla)
    assert cli.main(["tune", str(files["tiny"]), "--data", str(nixtla), "--output", str(tmp_path / "t.json")]) == 2
    line = _one_error(capsys)
    assert "missing column(s) ['series_id']" in line and "--id-col" not in line, line
    pytest.importorskip("torch")
    argv = ["export", "chronos_bolt", "--random-weights", "--data", str(nixtla), "--output", str(tmp_path / "m.onnx")]
    assert cli.main(argv) == 2
    line = _one_error(capsys)
    assert "missing column(s) ['series_id']" in line and "--id-col" not in line and "id_col" not in line, line


def test_export_timesfm_says_the_horizon_given_and_points_at_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export timesfm --random-weights --horizon 100`` said "--horizon 112" and asked to edit a
    ``forecast_config.json`` in a temporary folder deleted on exit."""
    pytest.importorskip("timesfm")
    argv = ["export", "timesfm", "--random-weights", "--horizon", "100", "--output", str(tmp_path / "t.onnx")]
    assert cli.main([*argv, "--resolution-minutes", "60"]) == 2
    line = _one_error(capsys)
    assert line.startswith("error: --horizon 100 takes 7 output patch(es) of 16 steps (112)"), line
    assert "give --horizon 64 or less" in line and "forecast_config" not in line and "/tmp" not in line, line


@pytest.mark.integration  # ONNX Runtime sessions of the folder's checkpoints
def test_inspect_takes_a_folder_as_backtest_does(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``inspect models/`` was refused ("Checkpoint weights not found") where ``backtest --checkpoint models/``
    takes every checkpoint in it."""
    assert cli.main(["inspect", str(files["models"])]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert [Path(each["checkpoint"]).name for each in documents] == ["tiny.onnx"]
    assert documents[0]["metadata"]["context_length"] == 64
    assert cli.main(["inspect", str(files["tiny"])]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"] == str(files["tiny"])  # a file: one document


def test_a_suggestion_reaches_python_as_keywords_and_survives_pickling() -> None:
    import pickle

    error = DataError("missing.", suggestions=(Suggestion("Pass {}.", (("id_col", "unique_id"),)),), path="x")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == "missing. Pass id_col='unique_id'." and again.path == "x"
    assert again.render({"id_col": "--id-col"}) == "missing. Pass --id-col unique_id."


def test_the_command_line_page_names_every_command_and_flag() -> None:
    """docs/cli.md's overview is written by hand: each command and flag the parser has must be on it."""
    page = (PACKAGE.parent / "docs" / "cli.md").read_text()
    missing = []
    for command in _commands():
        if f"distributed-onnx {command}" not in page:
            missing.append(command)
        flags = cli.command_flags(cli._parser([command]), command).values()
        missing += [f"{command} {flag}" for flag in flags if not re.search(rf"{re.escape(flag)}(?![\w-])", page)]
    assert not missing, missing


# --- no command writes over its own inputs ------------------------------------------------------------------------


def test_every_command_with_an_output_refuses_one_of_its_own_inputs_as_it(
    stopped: None, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tester's defect 1 as a class: ``tune --output`` the checkpoint's metadata (or its weights, its external data,
    the --data table) replaced it with JSON, exit 0. Every command that has an ``--output``, given each file it reads
    on its valid line (and a file of its checkpoint's), is refused (exit 2, naming --output) before its work, and
    the file is untouched: a new command is covered without editing this test."""
    tiny = files["tiny"]
    metadata = tiny.with_suffix(".metadata.json")
    before = {path: path.read_bytes() for path in (tiny, metadata, files["data"])}
    checked = []
    for command in _commands():
        if "--output" not in {o for a in _command_parser(command)._actions for o in a.option_strings}:
            continue
        base = _base(command, files, tmp_path)
        if command == "fev":  # its valid line names no checkpoint: its runs' checkpoint given
            base = [*base, "--checkpoint", str(tiny)]
        read = [Path(word) for word in base if Path(word) in before] + ([metadata] if str(tiny) in base else [])
        for target in read or [tiny]:  # export reads no file: its --output is an existing checkpoint
            argv = [*_without(base, "--output"), "--output", str(target)]
            code = cli.main(argv)
            line = _one_error(capsys)
            assert code == 2 and line.startswith("error: --output "), (command, target, line)
            assert "never writes over one of its own inputs" in line or "export never replaces one" in line, line
            if target == metadata:  # tune's checkpoint is named as its help names it, not "CHECKPOINT /tmp/..."
                given = "(the CHECKPOINT.onnx argument)" if command == "tune" else f"--checkpoint {tiny}"
                assert f"{metadata}, a file of the checkpoint " in line and given in line, line
                assert "CHECKPOINT " not in line, line
            checked.append((command, target.name))
    assert {command for command, _ in checked} == {"export", "fev", "tune", "backtest", "score"}, checked
    assert all(path.read_bytes() == content for path, content in before.items())


def test_the_tester_messages_say_what_is_wrong(
    stopped: None,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tester's defects 2 and 6, each through the CLI: export over an existing checkpoint replaced it (exit 0); a
    tuned file's NaN said only a bound's words; ``--accuracy-margin -inf`` was argparse's "expected one argument";
    ``export --output ""`` said ". is not a .onnx file name"; ``inspect data.parquet`` said its metadata was
    missing."""
    from distributed_onnx.tune import FORMAT

    tiny = files["tiny"]
    cases: list[tuple[list[str], list[str]]] = [
        (
            ["export", "chronos_bolt", "--random-weights", "--output", str(tiny), "--resolution-minutes", "30"],
            [f"--output {tiny}: a checkpoint is already there", "Remove it", "choose another --output"],
        ),
        (["tune", str(tiny), "--accuracy-margin", "-inf"], ["--accuracy-margin", "finite number"]),
        (["export", "chronos_bolt", "--random-weights", "--output", ""], ["--output", "is empty"]),
    ]
    tuned = tmp_path / "nan.json"
    settings = {"actors": 1, "cpus_per_actor": float("nan"), "rows_per_batch": 4, "graph_optimization": "all"}
    tuned.write_text(json.dumps({"format": FORMAT, "settings": settings}))
    cases.append(
        (
            ["backtest", *_base("backtest", files, tmp_path)[1:], "--tuned", str(tuned)],
            ["cpus_per_actor", "finite number"],
        )
    )
    before = tiny.read_bytes()
    for argv, says in cases:
        code = cli.main(argv)
        line = _one_error(capsys)
        assert code == 2 and all(words in line for words in says), (argv, line)
    assert tiny.read_bytes() == before
    monkeypatch.undo()  # inspect's refusal is in its work (reading the checkpoint)
    assert cli.main(["inspect", str(files["data"])]) == 2
    assert f"{files['data']} is not an .onnx checkpoint" in _one_error(capsys)
