"""The ``distributed-onnx`` command: ``inspect``, ``backtest`` and ``serve``.

Thin entry points: parse flags into typed settings, build objects, run. Project errors become one line on
stderr and exit code 2 (bad input) or 1 (a run that failed part-way); tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distributed_onnx.errors import BatchError, DistributedOnnxError

logger = logging.getLogger("distributed_onnx")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result: int = args.handler(args)
    except BatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except DistributedOnnxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distributed-onnx", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(required=True, dest="command")

    inspect = commands.add_parser("inspect", help="print a checkpoint's metadata, graph and the providers here")
    inspect.add_argument("checkpoint", type=Path)
    inspect.set_defaults(handler=_inspect)

    backtest = commands.add_parser("backtest", help="run (or resume) a distributed backtest")
    backtest.add_argument("--config", type=Path, help="YAML file of the same settings; flags override it")
    backtest.add_argument("--checkpoint", type=Path, help="the .onnx checkpoint (default: the bundled one)")
    # Strings, not Paths: a URL such as s3://bucket/runs/x must reach the settings unmangled.
    backtest.add_argument("--data", help="input table, path or URL (default: the bundled Taylor data)")
    backtest.add_argument("--output", help="run directory, path or URL (rerun it to resume)")
    backtest.add_argument("--horizon", type=int)
    backtest.add_argument("--context-length", type=int)
    backtest.add_argument("--n-windows", type=int, help="windows per series, the last ending at the series' end")
    backtest.add_argument("--stride", type=int, help="steps between origins")
    backtest.add_argument("--start", help="first origin (ISO timestamp, UTC if naive); with --end")
    backtest.add_argument("--end", help="last origin")
    backtest.add_argument("--quantiles", help="comma-separated, e.g. 0.1,0.5,0.9")
    backtest.add_argument("--covariates", help="comma-separated known-future covariate columns")
    backtest.add_argument("--seasonality", type=int, help="steps (default: one day)")
    backtest.add_argument("--min-context-coverage", type=float)
    backtest.add_argument("--actors", type=int)
    backtest.add_argument("--cpus-per-actor", type=float)
    backtest.add_argument("--gpus-per-actor", type=float)
    backtest.add_argument("--providers", help="explicit provider chain, e.g. cuda,cpu (strict)")
    backtest.add_argument("--rows-per-batch", type=int)
    backtest.add_argument("--max-in-flight-per-actor", type=int)
    backtest.add_argument("--address", help="Ray address (default: an embedded local Ray on 127.0.0.1)")
    backtest.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    backtest.set_defaults(handler=_backtest)

    serve = commands.add_parser("serve", help="serve a checkpoint over HTTP (foreground; Ctrl-C or SIGTERM stops)")
    serve.add_argument("--checkpoint", type=Path, help="the .onnx checkpoint (default: the bundled one)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port, KServe v2 GRPCInferenceService (default 8001)")
    serve.add_argument("--ingress", help="auto (default), direct, haproxy or proxy (Serve's Python proxy)")
    serve.add_argument("--replicas", type=int, help="replicas, one ONNX Runtime session each (default 1)")
    serve.add_argument("--cpus-per-replica", type=float, help="CPUs per replica; sets ORT's threads (default 1)")
    serve.add_argument("--gpus-per-replica", type=float, help="GPUs per replica, fractions share one (default 0)")
    serve.add_argument("--providers", help="explicit provider chain, e.g. cuda,cpu (strict)")
    serve.add_argument("--max-batch-size", type=int, help="forecast requests per model call; 1 = off (default 16)")
    serve.add_argument("--batch-wait-ms", type=float, help="how long a batch waits to fill (default 1)")
    serve.add_argument("--rows-per-batch", type=int, help="windows per model call; larger work is split (default 1024)")
    serve.add_argument("--max-queued-requests", type=int, help="queue before overload answers 503 (default 128)")
    serve.add_argument("--max-body-bytes", type=int, help="request body limit; larger gets 413 (default 8 MB)")
    serve.add_argument("--request-timeout-s", type=float, help="end-to-end request timeout (default 30)")
    serve.add_argument("--address", help="Ray address (default: an embedded local Ray on 127.0.0.1)")
    serve.set_defaults(handler=_serve)
    return parser


def _inspect(args: argparse.Namespace) -> int:
    from distributed_onnx.backend.onnx import OnnxBackend, available_providers, runtime_version
    from distributed_onnx.backend.providers import CpuProvider
    from distributed_onnx.checkpoint import LocalCheckpoint

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


_BACKTEST_KEYS = [
    "checkpoint",
    "data",
    "output",
    "horizon",
    "context_length",
    "n_windows",
    "stride",
    "start",
    "end",
    "quantiles",
    "covariates",
    "seasonality",
    "min_context_coverage",
    "actors",
    "cpus_per_actor",
    "gpus_per_actor",
    "providers",
    "rows_per_batch",
    "max_in_flight_per_actor",
    "address",
    "progress",
]


def _backtest(args: argparse.Namespace) -> int:
    from distributed_onnx.backtest.run import run_backtest
    from distributed_onnx.backtest.settings import BacktestSettings

    settings = BacktestSettings.from_sources({key: getattr(args, key) for key in _BACKTEST_KEYS}, args.config)
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


_SERVE_KEYS = [
    "checkpoint",
    "host",
    "port",
    "grpc_port",
    "ingress",
    "replicas",
    "cpus_per_replica",
    "gpus_per_replica",
    "providers",
    "max_batch_size",
    "batch_wait_ms",
    "rows_per_batch",
    "max_queued_requests",
    "max_body_bytes",
    "request_timeout_s",
    "address",
]


def _serve(args: argparse.Namespace) -> int:
    from distributed_onnx.serve.runner import serve_forever
    from distributed_onnx.serve.settings import ServeSettings

    return serve_forever(ServeSettings.from_sources({key: getattr(args, key) for key in _SERVE_KEYS}))
