"""The ``distributed-onnx`` command: ``inspect``, ``export``, ``tune``, ``backtest``, ``fev``, ``serve`` and ``score``.

Thin entry points: parse flags into typed settings, build objects, run. The flags of ``backtest`` and
``serve`` are generated from their settings models (:mod:`distributed_onnx.settings_sources`), so a new field
is a new flag with its description as help.

Every error a user can cause or meet is one line on stderr and an exit code (the README's table):
0 done, 1 a run in which some parts failed (resumable), 2 bad input or settings, 3 the environment failed
(storage that does not answer, Ray or the cluster: out of disk, a cancelled task, workers that could not
start; rerunning resumes), 4 an internal error: one line naming the log file that holds the traceback (a bug
to report), 130 interrupted.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from distributed_onnx.cli_words import normalized_words, parse_words
from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.redact import redact_text
from distributed_onnx.version import __version__

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
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt as interrupted:  # a command's own words when it has them (serve's start: no resume)
        again = "; rerun the same command to resume" if args.command in RESUMING_COMMANDS else ""
        print(f"error: {interrupted or f'interrupted{again}'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # every error ends here as one line and a code: see the module docstring
        code, line = describe_error(exc, resumes=args.command in RESUMING_COMMANDS)
        if code == EXIT_INTERNAL:
            line = f"{line} The traceback is in {_write_traceback(exc)}; please report it."
        if args.verbose and code != EXIT_INTERNAL:
            logger.debug("Traceback of the error below", exc_info=exc)
        print(f"error: {redact_text(line)}", file=sys.stderr)  # a URL's secrets never leave (redact.py)
        return code
    return result


#: The commands a rerun resumes (finished parts, scored batches are kept): only their lines say so.
RESUMING_COMMANDS = frozenset({"backtest", "score"})


def describe_error(exc: BaseException, *, resumes: bool = True) -> tuple[int, str]:
    """The exit code and the one line (without ``error:``) for an exception that ended a command; ``resumes``:
    whether rerunning the command resumes it (a backtest, a score), else the line says only to rerun."""
    cause = _own_cause(exc)
    if isinstance(cause, DistributedOnnxError):  # the class says (errors.py: the tree, grouped by exit code)
        return cause.exit_code, _one_line(cause)
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


def _one_line(exc: BaseException, limit: int = 2_000) -> str:
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


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line. Only the command given gets its flags: each settings model costs its imports (the
    backtest's data layer, Serve's settings) and its flags' generation, ~0.1 s before a backtest starts Ray."""
    from distributed_onnx.cli_words import PointingParser, plain_text

    given = _command_given(normalized_words(sys.argv[1:] if argv is None else argv))
    parser = PointingParser(prog="distributed-onnx", description=plain_text(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, Ray's own logging included (anywhere on the line)"
    )
    commands = parser.add_subparsers(required=True, dest="command")

    inspect = commands.add_parser(
        "inspect",
        help="print a checkpoint's metadata, graph and the providers here",
        description="Print a checkpoint's metadata, its graph's inputs and outputs, and the ONNX Runtime execution "
        "providers available on this machine, as JSON.",
    )
    inspect.add_argument(
        "checkpoint",
        type=Path,
        metavar="CHECKPOINT.onnx",
        help="the .onnx file; its metadata (STEM.metadata.json) must lie beside it",
    )
    inspect.set_defaults(handler=_inspect)

    export = commands.add_parser(
        "export",
        help="export a model family's pretrained folder to an ONNX checkpoint, with a parity report",
        description="Build FAMILY's graph from its upstream package and a local pretrained folder (or random "
        "weights, --random-weights), write the ONNX checkpoint and its metadata, and compare ONNX Runtime with the "
        "upstream pipeline on sample windows.",
    )
    export.add_argument("family", help=_family_help() if given == "export" else "the model family")
    source = export.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-pretrained", type=Path, metavar="DIR", help="local folder of the pretrained model")
    source.add_argument(
        "--random-weights",
        action="store_true",
        help="no download: the family with seeded random weights (forecasts are meaningless; for trying the "
        "pipeline and benchmarks), at --size",
    )
    export.add_argument(
        "--size",
        choices=["tiny", "published"],
        help="with --random-weights: tiny (the tests' small configs, seconds; default) or published (the "
        "published architecture)",
    )
    export.add_argument("--output", type=Path, required=True, metavar="MODEL.onnx", help="the ONNX file to write")
    export.add_argument("--data", metavar="PATH", help="input table whose windows the parity uses (a path or a URL)")
    export.add_argument("--parity-windows", type=int, default=32, metavar="N", help="windows the parity compares")
    export.add_argument(
        "--horizon",
        type=int,
        metavar="STEPS",
        help="the longest horizon the checkpoint will forecast; Chronos-2's graph computes the output patches "
        "upstream computes for it (default: the model's default prediction length), TimesFM's decodes them "
        "(default: one patch of 128); others: the parity's horizon",
    )
    export.add_argument(
        "--quantize",
        choices=["int8"],
        help="also write the int8 variant NAME-int8.onnx (its metadata names this checkpoint as its parent)",
    )
    export.add_argument(
        "--quantize-mode",
        choices=["dynamic", "static"],
        default="dynamic",
        help="dynamic (default; no data) or static (activations calibrated on --data's windows)",
    )
    export.add_argument(
        "--resolution-minutes",
        type=int,
        metavar="M",
        help="the data's sampling interval, for the metadata (default: the step of --data; required without it)",
    )
    export.set_defaults(handler=_export)

    _fev_command(commands)
    tune = commands.add_parser(
        "tune",
        help="measure the fastest backtest settings for a checkpoint on this machine (under a minute)",
        description="Measure graph optimization level, rows per batch and actors x threads with real ONNX Runtime "
        "sessions on windows of the data, and write the best to a file that backtest --tuned reads.",
    )
    tune.add_argument("checkpoint", type=Path, metavar="CHECKPOINT.onnx", help="the .onnx file to tune for")
    tune.add_argument("--data", metavar="PATH", help="input table whose windows are run (default: the bundled data)")
    tune.add_argument("--output", type=Path, default=Path("tune.json"), metavar="FILE.json", help="file to write")
    tune.add_argument("--budget-s", type=float, default=45.0, metavar="S", help="seconds of timed runs in all")
    tune.add_argument("--cpus", type=int, metavar="N", help="cores to spread over actors (default: this machine's)")
    tune.set_defaults(handler=_tune)

    for name, summary, settings, handler in _SETTINGS_COMMANDS:
        _settings_command(commands, name, summary, settings if name == given else None, handler)
    return parser


def _fev_command(commands: Any) -> None:
    fev = commands.add_parser(
        "fev",
        help="run a fev benchmark's tasks as backtests; summaries by fev itself (needs the fev extra)",
        description="Run every task of a fev benchmark YAML against each checkpoint as backtests on Ray, score "
        "them with fev's own Task.evaluation_summary and write OUTPUT/summaries.jsonl (docs/fev.md). Rerun to "
        "resume or to add a checkpoint.",
    )
    fev.add_argument("benchmark", metavar="BENCHMARK.yaml", help="fev benchmark YAML (a 'tasks' list), path or URL")
    fev.add_argument(
        "--checkpoint", action="append", type=Path, default=[], metavar="MODEL.onnx", help="repeat for several"
    )
    fev.add_argument("--output", required=True, metavar="DIR", help="output directory (a path or a URL)")
    fev.add_argument("--actors", type=int, metavar="N", help="worker actors (default: as many as the cluster fits)")
    fev.add_argument("--cpus-per-actor", type=float, metavar="N", help="CPUs per actor (default 1)")
    fev.add_argument("--address", metavar="ADDRESS", help="Ray address (default: an embedded local Ray)")
    fev.set_defaults(handler=_fev)


def _fev(args: argparse.Namespace) -> int:
    from distributed_onnx.evaluation.fev_tasks.runner import run_benchmark
    from distributed_onnx.storage import is_url, redact

    given = {"actors": args.actors, "cpus_per_actor": args.cpus_per_actor, "address": args.address}
    settings = {key: value for key, value in given.items() if value is not None}
    output = args.output if is_url(args.output) else Path(args.output)
    result = run_benchmark(args.benchmark, args.checkpoint, output, settings)
    counts = {status: sum(p["status"] == status for p in result.pairs) for status in ("done", "resumed", "skipped")}
    print(json.dumps({"pairs": counts, "skipped": [p for p in result.pairs if p["status"] == "skipped"]}, indent=2))
    print(f"wrote {redact(output)}/ (summaries.jsonl, fev_summary.json, runs/)")
    return 0


def _family_help() -> str:
    """The families ``export`` takes, from the family registry: the built-in ones with an exporter and the installed
    plugins (listed, not loaded: whether a plugin exports is known when it is asked for)."""
    from distributed_onnx.model import families

    built_in = [family.name for family in families.BUILT_IN if family.exporter is not None]
    plugins = [f"{name} (from {provider})" for name, provider in families.plugin_names().items()]
    text = f"the model family: {', '.join(built_in)}" + (
        f"; installed plugins: {', '.join(plugins)}" if plugins else ""
    )
    return text.replace("%", "%%")  # argparse formats help with %


def _command_given(argv: Sequence[str]) -> str | None:
    """The command in ``argv``: its first word that is not an option (the top level's options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _backtest_settings() -> type:
    from distributed_onnx.evaluation.settings import BacktestSettings

    return BacktestSettings


def _serve_settings() -> type:
    from distributed_onnx.serve.settings import ServeSettings

    return ServeSettings


def _score_settings() -> type:
    from distributed_onnx.live.score.settings import ScoreSettings

    return ScoreSettings


def _settings_command(
    commands: Any, name: str, summary: str, settings: Callable[[], type] | None, handler: Any
) -> None:
    """A subcommand whose flags are generated from its settings model (``settings``: None for a command that was
    not given, which only lists its name and summary), plus ``--config``."""
    if settings is None:
        commands.add_parser(name, help=summary)
        return
    from distributed_onnx.cli_words import plain_help, plain_text
    from distributed_onnx.settings_sources import ENV_PREFIX, add_flags

    model = settings()
    command = commands.add_parser(
        name,
        help=summary,
        description=plain_text(model.__doc__ or summary),
        epilog=f"Precedence: flags > {ENV_PREFIX}<SETTING> environment variables > --config YAML > "
        + ("--tuned file > " if name == "backtest" else "")
        + "defaults.",
    )
    command.add_argument(
        "--config",
        type=Path,
        metavar="FILE.yaml",
        help="YAML file of these settings (keys: the names with underscores)",
    )
    if name == "backtest":
        command.add_argument(
            "--tuned",
            type=Path,
            metavar="FILE.json",
            help="settings measured by distributed-onnx tune (below --config, the environment and flags)",
        )
    add_flags(command, model)
    plain_help(command)
    command.set_defaults(handler=handler)


def _inspect(args: argparse.Namespace) -> int:
    from distributed_onnx.model import families
    from distributed_onnx.model.backend.onnx import OnnxBackend, available_providers, runtime_version
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    resolved = LocalCheckpoint(path=args.checkpoint).resolve()
    backend = OnnxBackend.from_checkpoint(resolved, [CpuProvider()])
    document: dict[str, Any] = {
        "checkpoint": str(resolved.weights_path),
        "metadata": resolved.metadata.model_dump(mode="json") | {"horizon_length": resolved.metadata.horizon_length},
        "inputs": [spec.describe() for spec in backend.input_specs],
        "outputs": [spec.describe() for spec in backend.output_specs],
        "family": families.describe(resolved.metadata.model_family),
        "onnxruntime": runtime_version(),
        "available_providers": available_providers(),
    }
    print(json.dumps(document, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from distributed_onnx.errors import ConfigError, describe_validation
    from distributed_onnx.export import ExportRequest, run_export
    from distributed_onnx.export.common import MEANINGLESS

    if args.size is not None and not args.random_weights:
        raise ConfigError("--size goes with --random-weights (a --from-pretrained folder has its own size)")
    try:
        request = ExportRequest(
            family=args.family,
            pretrained_dir=args.from_pretrained,
            random_weights=(args.size or "tiny") if args.random_weights else None,
            output=args.output,
            data=args.data,
            parity_windows=args.parity_windows,
            horizon=args.horizon,
            quantize=args.quantize,
            quantize_mode=args.quantize_mode,
            resolution_minutes=args.resolution_minutes,
        )
    except ValidationError as exc:  # a flag out of its bounds (bounds.py): the user's, exit 2
        raise ConfigError(f"Invalid export settings: {describe_validation(exc.errors())}") from None
    if request.random_weights is not None:
        print(f"warning: {MEANINGLESS} ({args.family}, {request.random_weights})", file=sys.stderr)
    try:
        result = run_export(request)
    except OSError as exc:  # a full disk, a folder not writable: nothing to resume, the export starts over
        from distributed_onnx.errors import EnvironmentFailedError

        raise EnvironmentFailedError(
            f"I/O error while exporting to {request.output}: {type(exc).__name__}: {exc}. Fix it and export again."
        ) from exc
    print(json.dumps(result.parity, indent=2))
    print(f"wrote {result.weights_path}, {result.metadata_path.name} and {result.parity_path.name}")
    if result.variant_path is not None:
        print(json.dumps(result.variant, indent=2))
        print(f"wrote {result.variant_path} (int8, {args.quantize_mode}), its metadata and parity against the parent")
    if request.random_weights is not None:
        print(f"warning: {MEANINGLESS}: {result.weights_path} is not a trained model", file=sys.stderr)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from distributed_onnx.resources import REFERENCE_DATASET
    from distributed_onnx.tune import TuneRequest, run_tune

    request = TuneRequest(
        checkpoint=args.checkpoint,
        data=args.data or REFERENCE_DATASET,
        output=args.output,
        budget_s=args.budget_s,
        cpus=args.cpus,
    )
    document = run_tune(request)
    print(json.dumps({"settings": document["settings"], "windows_per_s": document["windows_per_s"]}, indent=2))
    print(f"wrote {args.output} (use it: distributed-onnx backtest --tuned {args.output} ...)")
    return 0


def _backtest(args: argparse.Namespace) -> int:
    import pyarrow.compute as pc

    from distributed_onnx.evaluation.driver.clock import process_started_perf_s
    from distributed_onnx.evaluation.driver.early import start_early
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.settings_sources import given_flags

    tuned = None
    if args.tuned is not None:
        from distributed_onnx.tune import read_tuned

        tuned = read_tuned(args.tuned)
    settings = BacktestSettings.from_sources(given_flags(args), args.config, environment=True, tuned=tuned)
    early = start_early(settings, quiet_ray=not args.verbose)  # Ray starts while the rest is imported (early.py)

    from distributed_onnx.evaluation.driver.run import run_backtest
    from distributed_onnx.storage import redact

    # A rerun's Ray starts after its plan, if at all (a finished run imports no Ray): quiet as the early start's.
    quiet = not args.verbose
    result = run_backtest(settings, process_started_perf_s(), wait_for_ray_stop=False, early=early, quiet_ray=quiet)
    # Only the global rows become Python objects (the result holds no per-series row: metrics.parquet does).
    run_wide = result.run_wide_metrics.filter(pc.equal(result.run_wide_metrics.column("scope"), "global"))
    print(json.dumps(_headline(result.summary, run_wide.to_pylist()), indent=2))
    print(f"wrote {redact(settings.output)}/ (forecasts/, metrics.parquet, summary.json, report.html)")
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
    from distributed_onnx.runtime.local_ray import quiet_ray_logging
    from distributed_onnx.serve.runner import serve_forever
    from distributed_onnx.serve.settings import ServeSettings
    from distributed_onnx.settings_sources import given_flags

    quiet_ray_logging(quiet=not args.verbose)
    return serve_forever(ServeSettings.from_sources(given_flags(args), args.config, environment=True))


def _score(args: argparse.Namespace) -> int:
    from distributed_onnx.live.score import score_log
    from distributed_onnx.live.score.folders import prepare_score
    from distributed_onnx.live.score.join import why_not_scored
    from distributed_onnx.live.score.settings import ScoreSettings
    from distributed_onnx.settings_sources import given_flags
    from distributed_onnx.storage import redact

    settings = ScoreSettings.from_sources(given_flags(args), args.config, environment=True)
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
    print(f"wrote {redact(settings.output)}/ ({', '.join(written)})")
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


#: The commands whose flags come from a settings model: name, one-line summary, the model's loader, handler.
_SETTINGS_COMMANDS: tuple[tuple[str, str, Callable[[], type], Callable[[argparse.Namespace], int]], ...] = (
    ("backtest", "run (or resume) a distributed backtest", _backtest_settings, _backtest),
    (
        "serve",
        "serve a checkpoint over HTTP and gRPC (KServe v2) on Ray Serve (foreground; Ctrl-C or SIGTERM stops)",
        _serve_settings,
        _serve,
    ),
    (
        "score",
        "score a forecast log against the actuals that have arrived (rerun: only what is new)",
        _score_settings,
        _score,
    ),
)
