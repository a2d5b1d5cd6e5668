"""The ``distributed-onnx`` command: ``inspect``, ``backtest``, ``serve`` and ``score``.

Thin entry points: parse flags into typed settings, build objects, run. The flags of ``backtest`` and
``serve`` are generated from their settings models (:mod:`distributed_onnx.settings_sources`), so a new field
is a new flag with its description as help. Project errors become one line on stderr and exit code 2 (bad
input) or 1 (a run that failed part-way); tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from distributed_onnx.errors import BatchError, DistributedOnnxError
from distributed_onnx.version import __version__

logger = logging.getLogger("distributed_onnx")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose)
    try:
        result: int = args.handler(args)
    except BatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except DistributedOnnxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return result


def configure_logging(*, verbose: bool) -> None:
    """Log lines at INFO; ours at DEBUG with ``--verbose`` (other libraries stay at INFO: matplotlib's DEBUG
    font search alone is hundreds of lines). Ray's own logging is the commands' business (``local_ray``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("distributed_onnx").setLevel(logging.DEBUG if verbose else logging.INFO)


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


def _parser() -> argparse.ArgumentParser:
    from distributed_onnx.evaluation.score_settings import ScoreSettings
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.serve.settings import ServeSettings

    parser = argparse.ArgumentParser(prog="distributed-onnx", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, Ray's own logging included")
    commands = parser.add_subparsers(required=True, dest="command")

    inspect = commands.add_parser("inspect", help="print a checkpoint's metadata, graph and the providers here")
    inspect.add_argument("checkpoint", type=Path)
    inspect.set_defaults(handler=_inspect)

    _settings_command(commands, "backtest", "run (or resume) a distributed backtest", BacktestSettings, _backtest)
    _settings_command(
        commands,
        "serve",
        "serve a checkpoint over HTTP and gRPC (KServe v2) on Ray Serve (foreground; Ctrl-C or SIGTERM stops)",
        ServeSettings,
        _serve,
    )
    _settings_command(
        commands,
        "score",
        "score a forecast log against the actuals that have arrived (rerun: only what is new)",
        ScoreSettings,
        _score,
    )
    return parser


def _settings_command(commands: Any, name: str, summary: str, model: Any, handler: Any) -> None:
    """A subcommand whose flags are generated from its settings model, plus ``--config``."""
    from distributed_onnx.settings_sources import ENV_PREFIX, add_flags

    command = commands.add_parser(
        name,
        help=summary,
        description=model.__doc__,
        epilog=f"Precedence: flags > {ENV_PREFIX}<SETTING> environment variables > --config YAML > defaults.",
    )
    command.add_argument(
        "--config",
        type=Path,
        metavar="FILE.yaml",
        help="YAML file of these settings (keys: the names with underscores)",
    )
    add_flags(command, model)
    command.set_defaults(handler=handler)


def _inspect(args: argparse.Namespace) -> int:
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
        "onnxruntime": runtime_version(),
        "available_providers": available_providers(),
    }
    print(json.dumps(document, indent=2))
    return 0


def _backtest(args: argparse.Namespace) -> int:
    from distributed_onnx.evaluation.run import run_backtest
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.runtime.local_ray import quiet_ray_logging
    from distributed_onnx.settings_sources import given_flags

    quiet_ray_logging(quiet=not args.verbose)
    settings = BacktestSettings.from_sources(given_flags(args), args.config, environment=True)
    result = run_backtest(settings)
    print(json.dumps(_headline(result.summary, result.metrics.to_pylist()), indent=2))
    print(f"wrote {settings.output}/ (forecasts/, metrics.parquet, summary.json, report.html)")
    return 0


def _headline(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    scores = {
        f"{row['model']}.{row['metric']}": round(row["value"], 4)
        for row in rows
        if row["scope"] == "global" and row["quantile"] is None and row["metric"] in {"mae", "mase", "wql"}
    }
    return {
        "windows": summary["windows"],
        "windows_per_s": summary["timing"]["windows_per_s"],
        "global": scores,
    }


def _serve(args: argparse.Namespace) -> int:
    from distributed_onnx.runtime.local_ray import quiet_ray_logging
    from distributed_onnx.serve.runner import serve_forever
    from distributed_onnx.serve.settings import ServeSettings
    from distributed_onnx.settings_sources import given_flags

    quiet_ray_logging(quiet=not args.verbose)
    return serve_forever(ServeSettings.from_sources(given_flags(args), args.config, environment=True))


def _score(args: argparse.Namespace) -> int:
    from distributed_onnx.evaluation.live import score_log
    from distributed_onnx.evaluation.score_settings import ScoreSettings
    from distributed_onnx.settings_sources import given_flags

    settings = ScoreSettings.from_sources(given_flags(args), args.config, environment=True)
    result = score_log(settings)
    print(json.dumps({"windows": result.summary["windows"], "new_batch": result.new_batch}, indent=2))
    print(f"wrote {settings.output}/ (scored/, metrics.parquet, summary.json)")
    return 0
