"""The commands: each one's settings model (imported only when it is the command given), its own extra
arguments, and its handler: settings -> one call -> print.

Apart from the entry point (:mod:`.cli`: the parser, the flow, the exit) so that a command is added or changed
here, in one place; what ``backtest`` and ``score`` print is :mod:`.cli_headlines`'.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distributed_onnx.cli_headlines import backtest_headline, failure_headline, folder_words, score_headline
from distributed_onnx.location import Location

if TYPE_CHECKING:
    from distributed_onnx.settings_sources import CommandSettings


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


def _settings(args: argparse.Namespace, **sources: Any) -> Any:
    """The command's settings model from its flags, the environment, ``--config`` and the defaults."""
    from distributed_onnx.settings_flags import given_flags
    from distributed_onnx.settings_sources import settings_model

    return settings_model(args).from_sources(given_flags(args), args.config, environment=True, as_flags=True, **sources)


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
    from distributed_onnx.export.metadata import MEANINGLESS

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
    print(f"wrote {folder_words(request.output)} (summaries.jsonl, fev_summary.json, runs/)")
    return 0


def _backtest(args: argparse.Namespace) -> int:
    import pyarrow.compute as pc

    from distributed_onnx import storage
    from distributed_onnx.evaluation.driver.clock import process_started_perf_s
    from distributed_onnx.evaluation.driver.early import start_early
    from distributed_onnx.evaluation.up_front import check_backtest, run_entries

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
    found = check_backtest(settings)  # what the whole run would be refused for, before Ray starts
    early = start_early(settings, found, quiet_ray=not args.verbose)  # Ray starts while the rest is imported

    from distributed_onnx.evaluation.backtest import run_backtest

    # A rerun's Ray starts after its plan, if at all (a finished run imports no Ray): quiet as the early start's.
    quiet = not args.verbose
    result = run_backtest(
        settings, process_started_perf_s(), wait_for_ray_stop=False, early=early, quiet_ray=quiet, tuned=chosen
    )
    # Only the global rows become Python objects (the result holds no per-series row: metrics.parquet does).
    run_wide = result.run_wide_metrics.filter(pc.equal(result.run_wide_metrics.column("scope"), "global"))
    print(json.dumps(backtest_headline(result.summary, run_wide.to_pylist()), indent=2))
    # What the run folder holds of what this backtest writes there (up_front.run_entries), folders with their "/".
    held = storage.entries(settings.output)
    written = ", ".join(f"{name}/" if held[name] else name for name in run_entries(settings) if name in held)
    print(f"wrote {folder_words(settings.output)} ({written})")
    return 0


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
    shown["global"] = score_headline(result.metrics.to_pylist() if result.metrics.num_rows < 100_000 else [])
    shown["failure_rates"] = failure_headline(result.summary["requests"])
    written = ["metrics.parquet", "leaderboard.parquet", "failures.parquet", "summary.json", "report.html"]
    if result.new_batch is not None:
        written.insert(0, "scored/")
    if result.versus_backtest is not None:
        shown["flagged_against_the_backtest"] = result.versus_backtest.flagged
        written.append("live_vs_backtest.parquet")
    print(json.dumps(shown, indent=2))
    not_scored = why_not_scored(result.summary)
    if not_scored is not None:  # summary.json has the counts; this says what they mean
        print(f"note: {not_scored}", file=sys.stderr)
    print(f"wrote {folder_words(settings.output)} ({', '.join(written)})")
    return 0


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
