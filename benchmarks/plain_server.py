"""The serving benchmark's anchor: one plain uvicorn + Starlette process doing the same /v1/forecast work.

Fair by construction: the same request model and JSON parser (``parse_body``), the same history block
(``plan_job``), the same worker call with one ORT thread, run in a thread off the event loop (as a replica
runs it), and the same response encoder (``encode_forecasts``). One process, no Ray.

    .venv/bin/python benchmarks/plain_server.py --port 8100 [--checkpoint X.onnx]
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.resources import REFERENCE_CHECKPOINT
from distributed_onnx.serve.wire.forecasting import encode_forecasts, plan_job
from distributed_onnx.serve.wire.http import parse_body
from distributed_onnx.serve.wire.schemas import ForecastRequest


def build(checkpoint: Path) -> Starlette:
    options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
    worker = InferenceWorker.from_config(
        WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()], session_options=options)
    )
    worker.warm_up()
    metadata, name = worker.metadata, worker.model_name
    model_thread = ThreadPoolExecutor(max_workers=1)

    async def forecast(request: Request) -> Response:
        parsed = parse_body(await request.body(), ForecastRequest)
        job = plan_job(parsed, metadata)
        loop = asyncio.get_running_loop()
        forecasts = await loop.run_in_executor(model_thread, worker.forecast, job.context, job.horizon, job.quantiles)
        body = encode_forecasts(name, parsed, forecasts, job.quantiles, metadata.resolution_minutes)
        return Response(body, media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(b'{"ready": true}', media_type="application/json")

    return Starlette(
        routes=[Route("/v1/forecast", forecast, methods=["POST"]), Route("/v2/health/ready", ready, methods=["GET"])]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--checkpoint", type=Path, default=REFERENCE_CHECKPOINT)
    args = parser.parse_args()
    uvicorn.run(build(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
