"""The multiplexing benchmark's server: several checkpoints behind one Ray Serve, placed four ways side by side.

Every way is an application of its own in the same Serve instance (so a benchmark can visit them in turn, round
after round, on the same machine state) and runs the same request handling (the ``/v1/forecast`` codec of
:mod:`distributed_onnx.serve.wire.forecasting`, the backtest's worker with one ORT thread per model, the model call in
a thread of its own; no batching) behind Serve's proxy on 127.0.0.1; only the placement and routing of the
models differ:

- ``/all/v1/forecast``: one deployment, every model in its one replica; the body's ``model`` field picks one
  (the design of ``distributed-onnx serve``).
- ``/mux/v1/forecast``: one deployment whose models load on demand through ``@serve.multiplexed`` (an LRU that
  holds every model), picked by the ``serve_multiplexed_model_id`` header; ``/mux1/...`` the same with an LRU of
  one model (every switch loads one).
- ``/pm/<model>/v1/forecast``: one application (one deployment, one replica) per model; the proxy routes by
  path, no extra hop.
- ``/router/v1/forecast``: one deployment per model behind a router deployment that reads ``model`` and calls
  the model's deployment through its handle (what one ``/v1/forecast`` entry, and a primary calling its
  shadows, would need with a deployment per model).

Each application answers ``GET <prefix>/ready``. Runs until SIGINT or SIGTERM::

    .venv/bin/python benchmarks/multiplex_server.py --port 8100 a.onnx b.onnx
"""

# No ``from __future__ import annotations``: Serve pickles the FastAPI apps to the replicas, where string route
# annotations do not resolve (as in distributed_onnx/serve/app.py).
import argparse
import asyncio
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI, Request, Response
from ray import serve

from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.runtime.local_ray import connect
from distributed_onnx.serve.operations.loopback import pin_replica_servers
from distributed_onnx.serve.wire.forecasting import encode_forecasts, plan_job
from distributed_onnx.serve.wire.http import parse_body
from distributed_onnx.serve.wire.schemas import ForecastRequest

#: Ray resources per replica: small enough that every way's replicas (4 + 2 x 4 models) fit the embedded Ray's 2
#: CPUs; each replica still runs one ORT thread per model.
REPLICA_CPUS = 0.1


class Model:
    """One checkpoint: its worker (one ORT thread, warm) and the thread its calls run in."""

    def __init__(self, checkpoint: Path) -> None:
        options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
        self.worker = InferenceWorker.from_config(
            WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()], session_options=options)
        )
        self.worker.warm_up()
        self._thread = ThreadPoolExecutor(max_workers=1)

    async def answer(self, parsed: ForecastRequest) -> bytes:
        metadata = self.worker.metadata
        job = plan_job(parsed, metadata)
        loop = asyncio.get_running_loop()
        forecasts = await loop.run_in_executor(
            self._thread, self.worker.forecast, job.context, job.horizon, job.quantiles
        )
        return encode_forecasts(self.worker.model_name, parsed, forecasts, job.quantiles, metadata.resolution_minutes)


def _pin() -> None:
    pin_replica_servers(ray.util.get_node_ip_address(), "127.0.0.1")  # type: ignore[no-untyped-call]


all_api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=64)
@serve.ingress(all_api)
class AllModels:
    def __init__(self, checkpoints: list[Path]) -> None:
        _pin()
        self.models = {path.stem: Model(path) for path in checkpoints}

    @all_api.get("/ready")
    async def ready(self) -> dict[str, bool]:
        return {"ready": True}

    @all_api.post("/v1/forecast")
    async def forecast(self, request: Request) -> Response:
        parsed = parse_body(await request.body(), ForecastRequest)
        body = await self.models[parsed.model or next(iter(self.models))].answer(parsed)
        return Response(body, media_type="application/json")


def multiplexed_deployment(max_models: int) -> Any:
    api = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=64)
    @serve.ingress(api)
    class Multiplexed:
        def __init__(self, checkpoints: list[Path]) -> None:
            _pin()
            self.paths = {path.stem: path for path in checkpoints}

        @serve.multiplexed(max_num_models_per_replica=max_models)
        async def model(self, model_id: str) -> Model:
            return await asyncio.to_thread(Model, self.paths[model_id])  # off the event loop: other models answer

        @api.get("/ready")
        async def ready(self) -> dict[str, bool]:
            return {"ready": True}

        @api.post("/v1/forecast")
        async def forecast(self, request: Request) -> Response:
            parsed = parse_body(await request.body(), ForecastRequest)
            model = await self.model(serve.get_multiplexed_model_id())
            return Response(await model.answer(parsed), media_type="application/json")

    return Multiplexed


one_api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=64)
@serve.ingress(one_api)
class OneModel:
    def __init__(self, checkpoint: Path) -> None:
        _pin()
        self.model = Model(checkpoint)

    @one_api.get("/ready")
    async def ready(self) -> dict[str, bool]:
        return {"ready": True}

    @one_api.post("/v1/forecast")
    async def forecast(self, request: Request) -> Response:
        body = await self.model.answer(parse_body(await request.body(), ForecastRequest))
        return Response(body, media_type="application/json")


@serve.deployment(ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=64)
class ModelBehindRouter:
    """A model's deployment reached only through handles (Serve allows one FastAPI ingress per application)."""

    def __init__(self, checkpoint: Path) -> None:
        _pin()
        self.model = Model(checkpoint)

    async def forecast_body(self, body: bytes) -> bytes:
        return await self.model.answer(parse_body(body, ForecastRequest))


router_api = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": REPLICA_CPUS}, max_ongoing_requests=64)
@serve.ingress(router_api)
class Router:
    def __init__(self, **handles: Any) -> None:
        _pin()
        self.handles = handles
        self.first = next(iter(handles))

    @router_api.get("/ready")
    async def ready(self) -> dict[str, bool]:
        return {"ready": True}

    @router_api.post("/v1/forecast")
    async def forecast(self, request: Request) -> Response:
        body = await request.body()
        parsed = parse_body(body, ForecastRequest)  # for its model field; the model's replica parses it again
        answer = await self.handles[parsed.model or self.first].forecast_body.remote(body)
        return Response(answer, media_type="application/json")


def deploy(checkpoints: list[Path]) -> str:
    """Every way side by side, one application each (their replicas apart); returns the last one's ready path."""
    serve.run(AllModels.bind(checkpoints), name="all", route_prefix="/all")
    serve.run(multiplexed_deployment(len(checkpoints)).bind(checkpoints), name="mux", route_prefix="/mux")
    serve.run(multiplexed_deployment(1).bind(checkpoints), name="mux1", route_prefix="/mux1")
    one: Any = OneModel
    for path in checkpoints:
        serve.run(
            one.options(name=f"OneModel_{path.stem}").bind(path),
            name=f"pm_{path.stem}",
            route_prefix=f"/pm/{path.stem}",
        )
    behind: Any = ModelBehindRouter
    handles = {path.stem: behind.options(name=f"Model_{path.stem}").bind(path) for path in checkpoints}
    serve.run(Router.bind(**handles), name="router", route_prefix="/router")
    return "/router/ready"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    args = parser.parse_args()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    connect(None)
    for signum in (signal.SIGINT, signal.SIGTERM):  # ray.init installs its own handlers: take them back
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        print(f"ready: {deploy(args.checkpoints)}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
