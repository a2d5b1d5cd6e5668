"""The Serve deployment: one replica = a pinned :class:`InferenceWorker` per checkpoint behind a FastAPI ingress.

Each replica builds :class:`distributed_onnx.runtime.actors.PinnedWorker` in ``__init__``, the body of the backtest's
actors, so provider handling, GPU pinning, thread sizing and warm-up are the same code. The deployment is a thin
shell: admission, threads, health and request planning live in :mod:`distributed_onnx.serve.core` (plain classes,
tested without Serve); the HTTP routes and gRPC methods below delegate to it, and the ``@serve.batch`` method is
the core's batcher. Routes:

- ``/v1/forecast``: validated in the ingress (a bad request fails alone), merged with concurrent requests into
  model calls of at most ``rows_per_batch`` windows (see :mod:`distributed_onnx.serve.core`).
- Open Inference Protocol (KServe v2): ``/v2/health/{live,ready}``, ``/v2``, ``/v2/models/{name}``,
  ``/v2/models/{name}/ready``, ``/v2/models/{name}/infer`` (JSON or Triton's binary tensor data extension,
  :mod:`distributed_onnx.serve.wire.binary`), and the same over gRPC (:mod:`distributed_onnx.serve.wire.grpc_messages`).

Several checkpoints (``--checkpoint`` repeated) live in *every* replica, each with its own session and model
thread: ``/v1/forecast`` picks one by its ``model`` field (default: the first that is not a shadow), KServe v2
addresses each as ``/v2/models/{name}``, and shadow models forecast each answered request after the answer has
gone (:mod:`distributed_onnx.serve.log.traffic`), logged to the forecast log (``--forecast-log``) and counted on
``GET /metrics`` (:mod:`distributed_onnx.serve.operations.metrics`). One deployment holding every model was chosen
over the two ways Ray Serve offers, and measured against them (``benchmarks/multiplex_bench.py``, figures in
``benchmarks/results/multiplex.md``): with the same handler, model multiplexing (``@serve.multiplexed``) serves
about as many requests as long as its LRU holds every model, but loads each model on its first request (a cold
request several times a warm one) and on every switch once the LRU is smaller than the models, while a shadow
needs its model warm on every request its primary answers, and KServe v2 routes by path, not by a header.
One deployment per model costs a replica's memory per model (a replica's Python and Ray dwarf a small
checkpoint's session) and, behind the one ``/v1/forecast`` entry (or a primary calling its shadows), a handle
call per request: the largest loss of requests per second of the ways measured. Multiplexing is the way for many
models that do not all fit in a replica: the checkpoint repository (``--model-repository``,
:mod:`distributed_onnx.serve.repository`) uses it, beside the ``--checkpoint`` models every replica holds.
The cost of this choice: each replica holds every model's session (memory) and they share its CPUs.

Bodies are read by the routes themselves so the size limit (413) and the memory charge (503) apply before any
parsing. Readiness (``/v2/health/ready`` and Serve's health check) runs no model call: it reads the outcomes of
the traffic's own calls (:mod:`distributed_onnx.serve.operations.health`).
"""

# No ``from __future__ import annotations`` here: Serve pickles the FastAPI app to the replicas, and route
# annotations left as strings come back as unresolvable ForwardRefs there (/openapi.json failed - measured).
import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from ray import serve

from distributed_onnx import storage
from distributed_onnx.errors import InferenceError
from distributed_onnx.live.log.failures import FailureLog
from distributed_onnx.live.log.health import warn_on_console
from distributed_onnx.live.log.layout import now_us
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.location import Location
from distributed_onnx.runtime.actors import PinnedWorker
from distributed_onnx.serve.core import ForecastAnswer, InferAnswer, ModelCore, ReplicaCore
from distributed_onnx.serve.infer_call import InferServed
from distributed_onnx.serve.log.traffic import REQUEST_ID_HEADER, LiveTraffic, request_id
from distributed_onnx.serve.operations.admission import Ticket
from distributed_onnx.serve.operations.loopback import pin_replica_servers
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.repository import CheckpointRepository, LoadedModel, ModelRepository, RepositoryMetrics
from distributed_onnx.serve.served_text import DOCS_SUMMARY, docs_description
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.binary import EXTENSION, HEADER_LENGTH
from distributed_onnx.serve.wire.failure_kinds import describe
from distributed_onnx.serve.wire.forecasting import ForecastJob
from distributed_onnx.serve.wire.grpc_api import check_decoded, grpc_call, metadata_response, warn_if_grpc_unbounded
from distributed_onnx.serve.wire.grpc_messages import (
    ModelInferResponse,
    ModelMetadataResponse,
    ModelReadyResponse,
    ServerLiveResponse,
    ServerMetadataResponse,
    ServerReadyResponse,
)
from distributed_onnx.serve.wire.http import (
    drained_on_refusal,
    infer_response,
    install_error_handlers,
    install_openapi_models,
    json_body,
    parse_body,
    read_body,
)
from distributed_onnx.serve.wire.schemas import (
    FORECAST_EXAMPLE,
    ErrorResponse,
    ForecastRequest,
    ForecastResponse,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RepositoryIndexRequest,
)
from distributed_onnx.version import __version__

logger = logging.getLogger(__name__)

APP_NAME = "distributed_onnx"
DEPLOYMENT_NAME = "OnnxForecastServer"
#: /docs' example body of /v1/forecast (see FORECAST_EXAMPLE).
FORECAST_EXAMPLES = {
    "taylor_ew": {
        "summary": "The bundled series taylor_ew on 2000-08-20 (half-hourly; null a missing value)",
        "value": FORECAST_EXAMPLE,
    }
}
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 500, 503)}

# FastAPIOffline serves Swagger UI's and ReDoc's assets from the fastapi-offline package: FastAPI's default
# /docs loads them from a CDN, so it is blank on a machine without internet access.
api = FastAPIOffline(
    title="distributed_onnx",
    description=DOCS_SUMMARY,
    version=__version__,
)
install_error_handlers(api)
install_openapi_models(api, [ForecastRequest, InferRequest], first_paths=("/v1/forecast",))


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class OnnxForecastServer:
    """A replica: its core (one model today), the routes that delegate to it and its batch queue."""

    def __init__(self, settings: ServeSettings) -> None:
        # Before Serve starts this replica's gRPC servers (after the constructor returns): keep them on loopback
        # when Ray is (the embedded Ray); see distributed_onnx.serve.operations.loopback.
        pin_replica_servers(ray.util.get_node_ip_address(), settings.host)  # type: ignore[no-untyped-call]
        warn_if_grpc_unbounded(settings.max_body_bytes)
        self._settings = settings
        # /docs names what this replica serves: its models, shadows and log (the document is built on first read).
        api.description = docs_description(settings)
        api.openapi_schema = None
        log = None
        if settings.forecast_log is not None:
            warn_on_console()  # a write that fails reaches serve's console, not only /metrics (live/log/health.py)
            log = ForecastLog(
                settings.forecast_log,
                max_queued_windows=settings.forecast_log_max_queued,
                flush_interval_s=settings.forecast_log_flush_s,
            )
        # The replica's one metrics system: its /metrics page (requests, where their time went, the log's counts).
        self._live_metrics = LiveMetrics(log, replica=f"{os.getpid()}")
        self._replica = ReplicaCore(settings, self._live_metrics)
        # Every checkpoint in this replica, each with its own session and model thread (see live_log's module
        # docstring for why one deployment holds them all).
        for checkpoint in settings.checkpoint:
            worker = PinnedWorker(settings.worker_config(checkpoint), settings.cpus_per_replica).worker
            model = self._replica.add_model(
                worker,
                shadow=checkpoint.stem in settings.shadow,
                checkpoint_sha256=worker.metadata.sha256 or storage.sha256(Location(checkpoint)),
            )
            model.set_batcher(self._batcher_for(model))
        self._forecast_windows.set_max_batch_size(settings.max_batch_size)  # type: ignore[attr-defined]
        self._forecast_windows.set_batch_wait_timeout_s(settings.batch_wait_ms / 1000.0)  # type: ignore[attr-defined]
        self._traffic = LiveTraffic(
            log, self._live_metrics, self._replica.shadows, shadow_fraction=settings.shadow_fraction
        )
        self._failures = FailureLog(log, describe)  # failed requests, into the log's failures table
        self._repository: ModelRepository | None = None
        if settings.model_repository is not None:
            # Serve's model multiplexing is the LRU (and routes by the serve_multiplexed_model_id header):
            # see distributed_onnx.serve.repository.
            self._repository = ModelRepository(
                CheckpointRepository(settings.model_repository),
                self._repository_model,
                RepositoryMetrics(self._live_metrics.registry, self._live_metrics.replica),
                retry_after_s=settings.retry_after_s,
            )
            load = self._repository.load

            # A plain function: Serve keeps its LRU as an attribute of what it wraps (a bound method takes none),
            # and takes a first argument with an attribute of the function's name for ``self`` (a str has none
            # called so).
            async def load_repository_checkpoint(name: str) -> LoadedModel:
                return await load(name)

            self._repository.set_cache(
                serve.multiplexed(max_num_models_per_replica=settings.repository_budget)(load_repository_checkpoint)
            )
            self._replica.repository = self._repository

    def _repository_model(self, name: str, weights: Path) -> ModelCore:
        """A repository checkpoint's model, built as a --checkpoint one is (in a thread: see repository.py)."""
        worker = PinnedWorker(self._settings.worker_config(weights), self._settings.cpus_per_replica).worker
        model = ModelCore(
            worker,
            self._settings,
            self._replica,
            checkpoint_sha256=worker.metadata.sha256 or storage.sha256(Location(weights)),
        )
        model.set_batcher(self._batcher_for(model))
        return model

    def __del__(self) -> None:
        """Serve calls this when the replica stops: write what the forecast log still holds."""
        traffic = getattr(self, "_traffic", None)
        if traffic is not None and traffic.log is not None:
            traffic.log.close(timeout_s=10.0)
        repository = getattr(self, "_repository", None)
        if repository is not None:
            repository.repository.close()  # the checkpoints it downloaded

    async def check_health(self) -> None:
        """Serve's health check: cheap, and never on the model thread (:mod:`.operations.health`)."""
        if not self._replica.ready:
            raise InferenceError(self._replica.not_ready_reason)

    # ------------------------------------------------------------------------------------------- health

    @api.get("/v2/health/live", summary="Liveness (Open Inference Protocol)")
    async def live(self) -> dict[str, bool]:
        return {"live": True}

    @api.get("/v2/health/ready", summary="Readiness: the model session is built, warm and healthy")
    async def ready(self) -> Response:
        if not self._replica.ready:
            return JSONResponse({"error": f"not ready: {self._replica.not_ready_reason}"}, status_code=503)
        return JSONResponse({"ready": True})

    @api.get("/v2", summary="Server metadata (Open Inference Protocol)")
    async def server_metadata(self) -> dict[str, Any]:
        return {"name": APP_NAME, "version": api.version, "extensions": [EXTENSION]}

    # ------------------------------------------------------------------------------------------- models

    @api.get("/v2/models", summary="The models served: those every replica holds, then the repository's")
    async def models(self) -> dict[str, list[str]]:
        return {"models": await asyncio.to_thread(self._model_names)}

    @api.post(
        "/v2/repository/index",
        responses=_ERRORS,
        summary="Triton's repository index: each model's name, version, state (READY in this replica, or "
        "UNAVAILABLE) and reason",
    )
    async def repository_index(self, request: Request) -> Response:
        body = await read_body(request, self._settings.max_body_bytes)
        ready_only = parse_body(body, RepositoryIndexRequest).ready if body.strip() else False
        fixed = list(self._replica.models)
        if self._repository is None:
            entries = [{"name": name, "version": "1", "state": "READY", "reason": ""} for name in fixed]
        else:
            entries = await asyncio.to_thread(self._repository.index, fixed, ready_only=ready_only)
        return JSONResponse(entries)

    def _model_names(self) -> list[str]:
        names = list(self._replica.models)
        if self._repository is not None:
            names += [name for name in self._repository.names() if name not in names]
        return names

    @api.get("/v2/models/{name}", response_model=ModelMetadata, responses=_ERRORS, summary="Model metadata")
    async def model_metadata(self, name: str) -> ModelMetadata:
        return (await self._replica.find_model(name)).model_metadata()

    @api.get("/v2/models/{name}/ready", responses=_ERRORS, summary="Model readiness")
    async def model_ready(self, name: str) -> Response:
        health = (await self._replica.find_model(name)).health
        if not health.ready:
            return JSONResponse({"error": f"not ready: {health.reason}"}, status_code=503)
        return JSONResponse({"ready": True})

    @api.get("/metrics", summary="Prometheus metrics of this replica (requests, where their time went, the log)")
    async def metrics(self) -> Response:
        body, content_type = self._live_metrics.render()
        return Response(body, media_type=content_type)

    @api.post(
        "/v2/models/{name}/infer",
        response_model=InferResponse,
        responses=_ERRORS,
        openapi_extra=json_body(InferRequest),
        summary="Run the model on named tensors (Open Inference Protocol, JSON or binary tensor data)",
    )
    async def infer(self, name: str, request: Request) -> Response:
        received_us = now_us()
        header_id = request.headers.get(REQUEST_ID_HEADER)
        answered: list[InferAnswer] = []

        async def handle(ticket: Ticket) -> Response:
            model = await self._replica.find_model(name)
            body = await read_body(request, self._settings.max_body_bytes, ticket)
            answer = await model.infer(body, request.headers.get(HEADER_LENGTH))
            answered.append(answer)
            return infer_response(answer.body, answer.header_length)

        answer_or_refusal = self._replica.observe("infer", handle, lambda: self._model_label(name))
        response = await self._failures.watch(
            drained_on_refusal(request, self._settings.max_body_bytes, answer_or_refusal),
            protocol="http",
            endpoint="infer",
            model=lambda: self._served_model(name),
            request_id=lambda: request_id(header_id),
            received_us=received_us,
        )
        # The log's request id: the v2 request's own ``id``, else x-request-id (the client's, or the one Serve gave
        # the request and returns in the response's header).
        served = answered[0].served
        self._infer_answered(served, request_id(served.request_id or header_id), received_us)
        return response

    def _served_model(self, name: str) -> str | None:
        """A served model's name (one every replica holds, or the repository's last listing has), else None: the
        failures table never takes a client's name for a model's."""
        if name in self._replica.models or (self._repository is not None and self._repository.knows(name)):
            return name
        return None

    def _model_label(self, name: str) -> str:
        """A served model's name, else ``-``: a label per unknown name a client sends would grow without bound."""
        known = name in self._replica.models or (self._repository is not None and self._repository.holds(name))
        return name if known else "-"

    def _infer_answered(self, served: InferServed, identifier: str, received_us: int) -> None:
        """Log and shadow an answered v2 infer (scheduled, not awaited: after the response is on its way)."""
        model = served.model  # the ModelCore that answered (a repository one may have been evicted since)
        assert isinstance(model, ModelCore)
        self._traffic.answered_later(model, served.windows.count, served.request, identifier, received_us)

    @api.post(
        "/v1/forecast",
        response_model=ForecastResponse,
        responses=_ERRORS,
        openapi_extra=json_body(ForecastRequest, FORECAST_EXAMPLES),
        summary="Quantile forecasts for one or many series",
    )
    async def forecast(self, request: Request) -> Response:
        received_us = now_us()
        identifier = request_id(request.headers.get(REQUEST_ID_HEADER))
        answered: list[ForecastAnswer] = []
        chosen: list[str] = []  # the model, once the body has named it (for the failures table)

        async def handle(ticket: Ticket) -> Response:
            body = await read_body(request, self._settings.max_body_bytes, ticket)
            answer = await self._replica.forecast(
                body, ticket, serve.get_multiplexed_model_id() or None, on_model=chosen.append
            )
            answered.append(answer)
            return Response(answer.body, media_type="application/json", headers={REQUEST_ID_HEADER: identifier})

        answer_or_refusal = self._replica.observe(
            "forecast", handle, lambda: answered[0].model.name if answered else "-"
        )
        response = await self._failures.watch(
            drained_on_refusal(request, self._settings.max_body_bytes, answer_or_refusal),
            protocol="http",
            endpoint="forecast",
            model=lambda: chosen[0] if chosen else None,
            request_id=lambda: identifier,
            received_us=received_us,
        )
        # Logging and shadows are scheduled, not awaited: they run after this response is on its way.
        answer = answered[0]
        self._traffic.answered(answer.model, answer.parsed, answer.forecasts, answer.quantiles, identifier, received_us)
        return response

    def _batcher_for(self, model: ModelCore) -> Callable[[ForecastJob], Awaitable[np.ndarray]]:
        async def batcher(job: ForecastJob) -> np.ndarray:
            result: np.ndarray | BaseException = await self._forecast_windows((model, job))
            if isinstance(result, BaseException):
                raise result
            return result

        return batcher

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _forecast_windows(self, jobs: list[tuple[ModelCore, ForecastJob]]) -> list[np.ndarray | BaseException]:
        """Concurrent forecasts merged into model calls: each model's jobs in one call, in that model's thread.

        A failing call fails the requests of its model only (its error is their result, raised by the batcher):
        Serve's batch would otherwise fail every request of the batch, other models' included.
        """
        by_model: dict[ModelCore, list[int]] = {}  # by the object: a repository model may be evicted, reloaded
        for index, (model, _) in enumerate(jobs):
            by_model.setdefault(model, []).append(index)
        results: list[np.ndarray | BaseException] = [np.empty(0)] * len(jobs)
        outcomes = await asyncio.gather(
            *(model.run_batch([jobs[i][1] for i in members]) for model, members in by_model.items()),
            return_exceptions=True,
        )
        for members, outcome in zip(by_model.values(), outcomes, strict=True):
            for position, index in enumerate(members):
                results[index] = outcome if isinstance(outcome, BaseException) else outcome[position]
        return results

    # ------------------------------------------------------------- KServe v2 over gRPC (grpc_messages)

    async def ServerLive(self, request: Any) -> Any:  # noqa: N802 - gRPC method names
        return ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any) -> Any:  # noqa: N802
        return ServerReadyResponse(ready=self._replica.ready)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        async def handle() -> Any:
            check_decoded(request)
            return ModelReadyResponse(ready=(await self._replica.find_model(request.name)).health.ready)

        return await grpc_call(grpc_context, ModelReadyResponse(), handle)

    async def ServerMetadata(self, request: Any) -> Any:  # noqa: N802
        return ServerMetadataResponse(name=APP_NAME, version=api.version, extensions=[])

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        async def handle() -> Any:
            check_decoded(request)
            return metadata_response((await self._replica.find_model(request.name)).model_metadata())

        return await grpc_call(grpc_context, ModelMetadataResponse(), handle)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        received_us = now_us()
        answered: list[InferServed] = []

        async def handle(ticket: Ticket) -> Any:
            check_decoded(request)
            model: ModelCore = await self._replica.find_model(request.model_name)
            response, served = await model.grpc_infer(request, ticket)
            answered.append(served)
            return response

        async def watched() -> Any:
            return await self._failures.watch(
                self._replica.observe("grpc_infer", handle, lambda: self._model_label(request.model_name)),
                protocol="grpc",
                endpoint="grpc_infer",
                model=lambda: self._served_model(request.model_name),
                request_id=lambda: request_id(request.id),
                received_us=received_us,
            )

        response = await grpc_call(grpc_context, ModelInferResponse(), watched)
        if answered:
            self._infer_answered(answered[0], request_id(answered[0].request_id), received_us)
        return response


def build_app(settings: ServeSettings) -> Any:
    """The Serve application (``serve.run(build_app(settings), route_prefix="/")``)."""
    deployment: Any = OnnxForecastServer  # a serve.Deployment once decorated; mypy sees the class
    if settings.forecast_log is not None:  # a replica's working folder is its node's: the log is where we say
        settings = settings.model_copy(update={"forecast_log": settings.forecast_log.absolute()})
    return deployment.options(**settings.deployment_options()).bind(settings)


def app_builder(args: dict[str, Any]) -> Any:
    """Entry point of a Serve config file (``import_path: distributed_onnx.serve.app:app_builder``)."""
    return build_app(ServeSettings.from_sources(dict(args), source="Serve config args"))
