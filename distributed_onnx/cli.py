"""The ``distributed-onnx`` command: ``inspect``, ``export``, ``tune``, ``backtest``, ``fev``, ``serve`` and ``score``.

Thin entry points: each command's arguments are generated from its settings model (:data:`COMMANDS`,
:mod:`distributed_onnx.settings_sources`), so a new field is a new flag with its description as help, an
environment variable and a ``--config`` key; each handler is settings -> one call -> print. What an error
suggests doing is rendered with the running command's own flags (:func:`command_flags`): a suggestion naming a
setting the command has no flag for is not shown.

Every error a user can cause or meet is one line on stderr and an exit code (the README's table):
0 done, 1 a run in which some parts failed (resumable), 2 bad input or settings, 3 the environment failed
(storage that does not answer, Ray or the cluster: out of disk, a cancelled task, workers that could not
start; rerunning resumes), 4 an internal error: one line naming the log file that holds the traceback (a bug
to report), 130 interrupted.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from distributed_onnx.cli_words import normalized_words, parse_words
from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text, shown
from distributed_onnx.runtime import ray_console
from distributed_onnx.version import __version__

if TYPE_CHECKING:
    from distributed_onnx.settings_sources import CommandSettings

logger = logging.getLogger("distributed_onnx")

EXIT_DONE = 0
EXIT_PARTS_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130


def run() -> NoReturn:
    """The console script (and ``python -m distributed_onnx``): :func:`main`, then a prompt exit.

    After a backtest, the interpreter's own teardown (freeing every module and object, Ray's native core
    worker included) took up to several seconds of wall time after the last file was written
    (``benchmarks/results/time_to_results.md``). By then every output is written and closed, so the
    command runs its exit handlers (``atexit``: logging's flush, Ray's shutdown), flushes its streams and
    leaves without the teardown; unless a non-daemon thread is still running, which the normal exit joins.
    """
    code = main()
    others = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
    if any(thread.is_alive() and not thread.daemon for thread in others):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    words = normalized_words(sys.argv[1:] if argv is None else argv)
    parser = _parser(words)
    args = parse_words(parser, words)
    configure_logging(verbose=args.verbose)
    ray_console.choose(quiet=not args.verbose)  # Ray's own lines only with -v, wherever a command starts Ray
    flags = command_flags(parser, args.command)
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt as interrupted:  # a command's own words when it has them (serve's start: no resume)
        print(f"error: {interrupted_line(interrupted, resumes=args.command in RESUMING_COMMANDS)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # every error ends here as one line and a code: see the module docstring
        code, line = describe_error(exc, resumes=args.command in RESUMING_COMMANDS, flags=flags)
        if code == EXIT_INTERNAL:
            line = f"{line} The traceback is in {_write_traceback(exc)}; please report it."
        if args.verbose and code != EXIT_INTERNAL:
            logger.debug("Traceback of the error below", exc_info=exc)
        print(f"error: {shown(line)}", file=sys.stderr)  # no URL's secret, no file's control bytes (redact.py)
        return code
    return result


#: The commands a rerun resumes (finished parts, scored batches are kept): only their lines say so.
RESUMING_COMMANDS = frozenset({"backtest", "score"})


def interrupted_line(interrupted: KeyboardInterrupt, *, resumes: bool) -> str:
    """The line (without ``error:``) for an interrupted command: the interruption's own words when it has them
    (an export stopped by SIGTERM), else what to do. Ctrl-C's ``KeyboardInterrupt`` has no words: its ``str`` is
    empty (the exception itself is always true, so ``interrupted or ...`` printed ``error:`` alone)."""
    again = "; rerun the same command to resume" if resumes else ""
    return _one_line(interrupted) if str(interrupted).strip() else f"interrupted{again}"


def describe_error(
    exc: BaseException, *, resumes: bool = True, flags: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """The exit code and the one line (without ``error:``) for an exception that ended a command; ``resumes``:
    whether rerunning the command resumes it (a backtest, a score), else the line says only to rerun; ``flags``:
    the command's flags by setting name, the only ones an error's suggestions may name (none: Python's words)."""
    cause = _own_cause(exc)
    if isinstance(cause, DistributedOnnxError):  # the class says (errors.py: the tree, grouped by exit code)
        return cause.exit_code, _one_line(cause.render(flags) if flags is not None else cause)
    ray_exceptions = sys.modules.get("ray.exceptions")  # a Ray error needs Ray imported: never import it here
    # A task's own exception (RayTaskError) is ours: a bug, below.
    if (
        ray_exceptions is not None
        and isinstance(exc, ray_exceptions.RayError)
        and not isinstance(exc, ray_exceptions.RayTaskError)
    ):
        kept = "Finished parts are kept; fix" if resumes else "Fix"
        again = "rerun the same command to resume" if resumes else "rerun"
        return EXIT_ENVIRONMENT, (
            f"Ray failed: {type(exc).__name__}: {_one_line(exc)}. {kept} the cluster (disk, memory, nodes) and {again}."
        )
    if isinstance(exc, OSError):  # storage or the system (a full disk, a store that stopped answering)
        again = "Finished parts are kept; rerun the same command to resume." if resumes else "Fix it and rerun."
        return EXIT_ENVIRONMENT, f"I/O error: {type(exc).__name__}: {_one_line(exc)}. {again}"
    if isinstance(exc, MemoryError):
        again = "finished parts are kept, rerun to resume" if resumes else "free memory and rerun"
        return EXIT_ENVIRONMENT, f"out of memory (MemoryError); {again}."
    return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {_one_line(exc)}."


def _own_cause(exc: BaseException) -> BaseException:
    """Our own error inside a Ray task error (``RayTaskError.cause``), else ``exc`` itself."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, DistributedOnnxError) else exc


def _one_line(exc: BaseException | str, limit: int = 2_000) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_traceback(exc: BaseException) -> str:
    """Write ``exc``'s traceback to a new log file in the temporary directory and return its path."""
    import tempfile
    import traceback

    handle, path = tempfile.mkstemp(prefix="distributed-onnx-error-", suffix=".log")
    with open(handle, "w", encoding="utf-8") as log:
        log.write(f"{version_text()}\ncommand: {redact_text(' '.join(sys.argv))}\n\n")
        log.write(redact_text("".join(traceback.format_exception(exc))))
    return path


def configure_logging(*, verbose: bool) -> None:
    """Log lines at INFO; ours at DEBUG with ``--verbose`` (other libraries stay at INFO: matplotlib's DEBUG
    font search alone is hundreds of lines). Ray's own logging is the commands' business (``local_ray``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # every line logged here, a library's too, without URL secrets
        if not isinstance(handler.formatter, RedactingFormatter):
            handler.setFormatter(RedactingFormatter(handler.formatter))
    logging.getLogger("distributed_onnx").setLevel(logging.DEBUG if verbose else logging.INFO)


class RedactingFormatter(logging.Formatter):
    """A handler's formatter whose lines (message, traceback) have every URL :func:`redact_text`-ed."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(self.inner.format(record))


def version_text() -> str:
    """``distributed-onnx X (python Y; onnxruntime Z, ray W)`` from installed metadata, without importing them."""
    runtimes = []
    for label, distributions in (("onnxruntime", ("onnxruntime", "onnxruntime-gpu")), ("ray", ("ray",))):
        found = "not installed"
        for distribution in distributions:
            try:
                found = metadata.version(distribution) + ("" if distribution == label else f" ({distribution})")
                break
            except metadata.PackageNotFoundError:
                continue
        runtimes.append(f"{label} {found}")
    return f"distributed-onnx {__version__} (python {platform.python_version()}; {', '.join(runtimes)})"


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, its one-line summary, the loader of its settings model (imported only when the
    command is the one given), its handler (settings -> one call -> print) and its own extra arguments."""

    name: str
    summary: str
    settings: Callable[[], type[CommandSettings]]
    handler: Callable[[argparse.Namespace], int]
    #: Called with the command's parser once its flags are generated: its own arguments (``--tuned``), its help.
    extra: Callable[[argparse.ArgumentParser], None] | None = None


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line, every subcommand generated from its settings model (:data:`COMMANDS`). Only the command
    given gets its flags: each model costs its imports (the backtest's data layer, Serve's settings) and its flags'
    generation, ~0.1 s before a backtest starts Ray."""
    from distributed_onnx.cli_words import PointingParser, plain_text

    given = _command_given(normalized_words(sys.argv[1:] if argv is None else argv))
    parser = PointingParser(prog="distributed-onnx", description=plain_text(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, Ray's own logging included (anywhere on the line)"
    )
    commands = parser.add_subparsers(required=True, dest="command")
    for command in COMMANDS:
        if command.name == given:
            _settings_command(commands, command)
        else:
            commands.add_parser(command.name, help=command.summary)
    return parser


def _settings_command(commands: Any, command: Command) -> None:
    """The subcommand's arguments generated from its settings model, plus ``--config`` and its extras."""
    from distributed_onnx.cli_words import plain_help, plain_text
    from distributed_onnx.settings_sources import ENV_PREFIX, add_flags

    model = command.settings()
    parser = commands.add_parser(
        command.name,
        help=command.summary,
        description=plain_text(model.__doc__ or command.summary),
        epilog=f"Precedence: flags > {ENV_PREFIX}<SETTING> environment variables > --config YAML > "
        + ("--tuned file > " if command.name == "backtest" else "")
        + "defaults.",
    )
    parser.add_argument(
        "--config",
        type=Location.parse,
        metavar="FILE.yaml",
        help="YAML file of these settings (keys: the names with underscores)",
    )
    add_flags(parser, model)
    if command.extra is not None:
        command.extra(parser)
    plain_help(parser)
    parser.set_defaults(handler=command.handler)


def _settings(args: argparse.Namespace, **sources: Any) -> Any:
    """The command's settings model from its flags, the environment, ``--config`` and the defaults."""
    from distributed_onnx.settings_sources import given_flags, settings_model

    return settings_model(args).from_sources(given_flags(args), args.config, environment=True, as_flags=True, **sources)


def command_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """The flags of ``command`` in ``parser``, by setting name (an argument's ``dest``): what a suggestion in an
    error may name (:meth:`~distributed_onnx.errors.DistributedOnnxError.render`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen: argparse.ArgumentParser = action.choices[command]
            return {
                each.dest: each.option_strings[0]
                for each in chosen._actions
                if each.option_strings and each.option_strings[0].startswith("--")
            }
    return {}


def _family_help(parser: argparse.ArgumentParser) -> None:
    """``export``'s FAMILY help: the families it takes, from the family registry: the built-in ones with an exporter
    and the installed plugins (listed, not loaded: whether a plugin exports is known when it is asked for)."""
    from distributed_onnx.model import families

    action = next(each for each in parser._actions if each.dest == "family")
    built_in = [family.name for family in families.BUILT_IN if family.exporter is not None]
    plugins = [f"{name} (from {provider})" for name, provider in families.plugin_names().items()]
    text = f"the model family: {', '.join(built_in)}" + (
        f"; installed plugins: {', '.join(plugins)}" if plugins else ""
    )
    action.help = text.replace("%", "%%")  # argparse formats help with %


def _command_given(argv: Sequence[str]) -> str | None:
    """The command in ``argv``: its first word that is not an option (the top level's options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _tuned_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tuned",
        type=Location.parse,
        metavar="FILE.json",
        help="settings measured by distributed-onnx tune (below --config, the environment and flags)",
    )


def _inspect(args: argparse.Namespace) -> int:
    from distributed_onnx.model.inspection import inspect_checkpoints

    print(json.dumps(inspect_checkpoints(_settings(args)), indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    from distributed_onnx.errors import EnvironmentFailedError
    from distributed_onnx.export import run_export
    from distributed_onnx.export.common import MEANINGLESS

    request = _settings(args)
    if request.random_size is not None:
        print(f"warning: {MEANINGLESS} ({request.family}, {request.random_size})", file=sys.stderr)
    try:
        result = run_export(request)
    except OSError as exc:  # a full disk, a folder not writable: nothing to resume, the export starts over
        raise EnvironmentFailedError(
            f"I/O error while exporting to {request.output}: {type(exc).__name__}: {exc}. Fix it and export again."
        ) from exc
    print(json.dumps(result.parity, indent=2))
    print(f"wrote {result.weights_path}, {result.metadata_path.name} and {result.parity_path.name}")
    if result.variant_path is not None:
        print(json.dumps(result.variant, indent=2))
        print(
            f"wrote {result.variant_path} (int8, {request.quantize_mode}), its metadata and parity against the parent"
        )
    if request.random_size is not None:
        print(f"warning: {MEANINGLESS}: {result.weights_path} is not a trained model", file=sys.stderr)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from distributed_onnx.tune import choice_lines, run_tune

    request = _settings(args)
    document = run_tune(request)
    print(json.dumps({"settings": document["settings"], "windows_per_s": document["windows_per_s"]}, indent=2))
    print(*choice_lines(document), sep="\n")
    print(f"wrote {request.output} (use it: distributed-onnx backtest --tuned {request.output} ...)")
    return 0


def _fev(args: argparse.Namespace) -> int:
    from distributed_onnx.evaluation.fev_tasks.runner import run_benchmark

    request = _settings(args)
    result = run_benchmark(request.benchmark, request.checkpoint, request.output, request.backtest_settings())
    counts = {status: sum(p["status"] == status for p in result.pairs) for status in ("done", "resumed", "skipped")}
    print(json.dumps({"pairs": counts, "skipped": [p for p in result.pairs if p["status"] == "skipped"]}, indent=2))
    print(f"wrote {request.output}/ (summaries.jsonl, fev_summary.json, runs/)")
    return 0


def _backtest(args: argparse.Namespace) -> int:
    import pyarrow.compute as pc

    from distributed_onnx.evaluation.driver.clock import process_started_perf_s
    from distributed_onnx.evaluation.driver.early import start_early
    from distributed_onnx.evaluation.up_front import check_backtest

    tuned = None
    if args.tuned is not None:
        from distributed_onnx.tuned_file import load_tuned

        tuned = load_tuned(args.tuned)
    settings = _settings(args, tuned=tuned.source if tuned is not None else None)
    chosen = None
    if tuned is not None:
        # Measured on another checkpoint: refused, naming both. A variant tune chose runs in its parent's place; the
        # file and what it changed are said and recorded, choice or not.
        from distributed_onnx.tuned_file import tuned_lines

        checkpoints, chosen = tuned.checkpoints_to_run(settings.checkpoint, settings)
        settings = settings.model_copy(update={"checkpoint": checkpoints})
        print("\n".join(tuned_lines(chosen)), file=sys.stderr)
    check_backtest(settings)  # what the whole run would be refused for, before Ray starts
    early = start_early(settings, quiet_ray=not args.verbose)  # Ray starts while the rest is imported (early.py)

    from distributed_onnx.evaluation.backtest import run_backtest

    # A rerun's Ray starts after its plan, if at all (a finished run imports no Ray): quiet as the early start's.
    quiet = not args.verbose
    result = run_backtest(
        settings, process_started_perf_s(), wait_for_ray_stop=False, early=early, quiet_ray=quiet, tuned=chosen
    )
    # Only the global rows become Python objects (the result holds no per-series row: metrics.parquet does).
    run_wide = result.run_wide_metrics.filter(pc.equal(result.run_wide_metrics.column("scope"), "global"))
    print(json.dumps(_headline(result.summary, run_wide.to_pylist()), indent=2))
    print(f"wrote {settings.output}/ (forecasts/, metrics.parquet, summary.json, report.html)")
    return 0


def _headline(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    scores = {f"{row['model']}.{row['metric']}": round(row["value"], 4) for row in _headline_rows(rows)}
    return {
        "windows": summary["windows"],
        "windows_per_s": summary["timing"]["windows_per_s"],
        "global": scores,
    }


def _headline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the metrics table that ``backtest`` and ``score`` print: the global pooled value of each
    headline metric (:func:`~distributed_onnx.evaluation.scoring.registry.headline`)."""
    from distributed_onnx.evaluation.scoring.registry import POOLED, headline

    shown = headline()
    return [
        row
        for row in rows
        if row["scope"] == "global"
        and row["quantile"] is None
        and row["metric"] in shown
        and row.get("convention", POOLED) == POOLED
        and row["value"] is not None
    ]


def _serve(args: argparse.Namespace) -> int:
    from distributed_onnx.serve.runner import serve_forever

    return serve_forever(_settings(args))


def _score(args: argparse.Namespace) -> int:
    from distributed_onnx.live.score import score_log
    from distributed_onnx.live.score.folders import prepare_score
    from distributed_onnx.live.score.join import why_not_scored

    settings = _settings(args)
    settings, borrowed = prepare_score(settings)  # the folders checked, --backtest's settings lent (exit 2)
    result = score_log(settings)
    shown: dict[str, Any] = {"windows": result.summary["windows"], "new_batch": result.new_batch}
    if borrowed:
        shown["from_the_backtest"] = borrowed
    shown["global"] = _score_headline(result.metrics.to_pylist() if result.metrics.num_rows < 100_000 else [])
    shown["failure_rates"] = _failure_headline(result.summary["requests"])
    written = ["metrics.parquet", "leaderboard.parquet", "failures.parquet", "summary.json", "report.html"]
    if result.new_batch is not None:
        written.insert(0, "scored/")
    if result.versus_backtest is not None:
        shown["flagged_against_the_backtest"] = result.versus_backtest.flagged
        written.append("live_vs_backtest.parquet")
    print(json.dumps(shown, indent=2))
    not_scored = why_not_scored(result.summary["windows"])
    if not_scored is not None:  # summary.json has the counts; this says what they mean
        print(f"note: {not_scored}", file=sys.stderr)
    print(f"wrote {settings.output}/ ({', '.join(written)})")
    return 0


def _failure_headline(requests: dict[str, Any]) -> dict[str, Any] | str:
    """Each model's requests, failures by kind (the non-zero ones) and failure rate, from summary.json."""
    if not requests.get("recorded"):
        return "not recorded (a log written before failures were logged)"
    shown: dict[str, Any] = {}
    for model, counts in [*requests["models"].items(), ("(model not known)", requests["unattributed"])]:
        if counts["requests"]:
            rate = counts["failure_rate"]
            failed = {kind: n for kind, n in counts["failed_by_kind"].items() if n}
            shown[model] = {"requests": counts["requests"], "failed": failed, "failure_rate": round(rate, 4)}
    return shown


def _score_headline(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The headline metrics of each model (:func:`_headline_rows`), per group of checkpoints scored together."""
    groups: dict[str, dict[str, float]] = {}
    for row in _headline_rows(rows):
        groups.setdefault(str(row.get("scored_with")), {})[f"{row['model']}.{row['metric']}"] = round(row["value"], 4)
    return groups


def _model(module: str, name: str) -> Callable[[], type[CommandSettings]]:
    """A loader of the settings model ``module.name``, imported when its command is the one given."""

    def load() -> type[CommandSettings]:
        model: type[CommandSettings] = getattr(importlib.import_module(module), name)
        return model

    return load


#: Every command, in the order ``--help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "inspect",
        "print a checkpoint's metadata, graph and the providers here",
        _model("distributed_onnx.model.inspection", "InspectRequest"),
        _inspect,
    ),
    Command(
        "export",
        "export a model family's pretrained folder to an ONNX checkpoint, with a parity report",
        _model("distributed_onnx.export.request", "ExportRequest"),
        _export,
        extra=_family_help,
    ),
    Command(
        "fev",
        "run a fev benchmark's tasks as backtests; summaries by fev itself (needs the fev extra)",
        _model("distributed_onnx.evaluation.fev_tasks.request", "FevRequest"),
        _fev,
    ),
    Command(
        "tune",
        "measure the fastest backtest settings for a checkpoint on this machine (under a minute)",
        _model("distributed_onnx.tune", "TuneRequest"),
        _tune,
    ),
    Command(
        "backtest",
        "run (or resume) a distributed backtest",
        _model("distributed_onnx.evaluation.settings", "BacktestSettings"),
        _backtest,
        extra=_tuned_argument,
    ),
    Command(
        "serve",
        "serve a checkpoint over HTTP and gRPC (KServe v2) on Ray Serve (foreground; Ctrl-C or SIGTERM stops)",
        _model("distributed_onnx.serve.settings", "ServeSettings"),
        _serve,
    ),
    Command(
        "score",
        "score a forecast log against the actuals that have arrived (rerun: only what is new)",
        _model("distributed_onnx.live.score.settings", "ScoreSettings"),
        _score,
    ),
)
