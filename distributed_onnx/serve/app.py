"""The Serve deployment: one replica = one pinned :class:`InferenceWorker` behind a FastAPI ingress.

Each replica builds :class:`distributed_onnx.runtime.actors.PinnedWorker` in ``__init__``, the body of the backtest's
actors, so provider handling, GPU pinning, thread sizing and warm-up are the same code. Routes:

- ``/v1/forecast``: validated in the ingress (a bad request fails alone), then, unless the replica is idle
  (then it runs at once), merged with concurrent requests by one ``@serve.batch`` method into model calls of
  at most ``rows_per_batch`` windows per distinct (horizon, quantiles), run in the replica's model thread (ORT
  releases the GIL), split back per request. A failing model call fails every request of its batch (JSON 500).
- Open Inference Protocol (KServe v2): ``/v2/health/{live,ready}``, ``/v2``, ``/v2/models/{name}``,
  ``/v2/models/{name}/ready``, ``/v2/models/{name}/infer``. Infer requests run *unbatched*: concatenating
  requests along axis 0 is not semantics-preserving for every graph (Chronos-2's ``group_ids`` would merge
  the groups of different requests), so each request is one ``backend.run`` in the model thread. Tensor data
  is JSON or binary (Triton's binary tensor data extension, :mod:`distributed_onnx.serve.binary`), which is
  what ``tritonclient.http`` sends and asks for by default.

Bodies are read by the routes themselves so the size limit (413) applies before any parsing; large ones are
parsed, and large responses encoded, in a codec thread, off the event loop that serves the other requests.
Readiness (``/v2/health/ready`` and Serve's health check) runs no model call: it reads the outcomes of the
traffic's own calls (:mod:`distributed_onnx.serve.health`).
"""

# No ``from __future__ import annotations`` here: Serve pickles the FastAPI app to the replicas, and route
# annotations left as strings come back as unresolvable ForwardRefs there (/openapi.json failed - measured).
import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import ray
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from ray import serve

from distributed_onnx.errors import BackendClosedError, InferenceError
from distributed_onnx.runtime.actors import PinnedWorker
from distributed_onnx.serve.binary import EXTENSION, HEADER_LENGTH, binary_outputs, encode_response
from distributed_onnx.serve.forecasting import ForecastJob, encode_forecasts, plan_job, run_jobs
from distributed_onnx.serve.grpc_api import (
    grpc_code,
    infer_inputs,
    metadata_response,
    model_infer_response,
    requested_outputs,
)
from distributed_onnx.serve.grpc_messages import (
    ModelInferResponse,
    ModelMetadataResponse,
    ModelReadyResponse,
    ServerLiveResponse,
    ServerMetadataResponse,
    ServerReadyResponse,
)
from distributed_onnx.serve.health import ModelHealth
from distributed_onnx.serve.http import (
    HttpError,
    infer_response,
    install_error_handlers,
    install_openapi_models,
    json_body,
    parse_body,
    parse_infer_request,
    read_body,
    status_of,
)
from distributed_onnx.serve.loopback import pin_replica_servers
from distributed_onnx.serve.protocol import decode_inputs, run_checked, select_outputs, tensor_metadata
from distributed_onnx.serve.schemas import (
    ErrorResponse,
    ForecastRequest,
    ForecastResponse,
    InferRequest,
    InferResponse,
    ModelMetadata,
)
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.telemetry import ServeMetrics
from distributed_onnx.version import __version__

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InferCall:
    """A decoded v2 infer request: the model's inputs and what to send back."""

    inputs: dict[str, np.ndarray]
    names: list[str]
    binary: set[str]
    document: dict[str, Any]


APP_NAME = "distributed_onnx"
DEPLOYMENT_NAME = "OnnxForecastServer"
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 500, 503)}

#: Bodies above this are parsed (and their histories built) in the codec thread, off the event loop that runs
#: the other requests and the batch timer. Below it parsing inline is cheaper than the hop: a thread hop costs
#: ~170 us here, parsing ~3.6 us per KB (20 us for one 168-step series, 3.5 ms for 64 x 512 steps - measured).
OFFLOAD_BODY_BYTES = 64 * 1024
#: Responses with more forecast values than this are encoded in the codec thread (~55 ns per value, measured).
OFFLOAD_RESPONSE_VALUES = 4096

# FastAPIOffline serves Swagger UI's and ReDoc's assets from the fastapi-offline package: FastAPI's default
# /docs loads them from a CDN, so it is blank on a machine without internet access.
api = FastAPIOffline(
    title="distributed_onnx",
    description="Quantile forecasts from an ONNX checkpoint: /v1/forecast and the Open Inference Protocol (v2).",
    version=__version__,
)
install_error_handlers(api)
install_openapi_models(api, [ForecastRequest, InferRequest])


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class OnnxForecastServer:
    """A replica: one pinned worker, its batch queue and its metrics."""

    def __init__(self, settings: ServeSettings) -> None:
        # Before Serve starts this replica's gRPC servers (after the constructor returns): keep them on loopback
        # when Ray is (the embedded Ray); see distributed_onnx.serve.loopback.
        pin_replica_servers(ray.util.get_node_ip_address(), settings.host)  # type: ignore[no-untyped-call]
        self._settings = settings
        self._worker = PinnedWorker(settings.worker_config(), settings.cpus_per_replica).worker
        self._metadata = self._worker.metadata
        self._name = self._worker.model_name
        backend = self._worker.backend
        self._input_specs = list(backend.input_specs)
        self._output_specs = list(backend.output_specs)
        self._metrics = ServeMetrics()
        # One thread runs every model call (forecast batches, v2 infer) off the event loop, so the session sees
        # one call at a time with the threads PinnedWorker sized for this replica's CPUs, rather than asyncio's
        # default pool oversubscribing them. A second thread parses and encodes large bodies (OFFLOAD_*).
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnx")
        self._codec_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec")
        self._health = ModelHealth(settings.max_consecutive_model_failures)
        self._forecasts_in_flight = 0  # /v1/forecast requests between validation and their result
        self._admitted = 0  # requests inside this replica (forecast, infer, gRPC ModelInfer)
        self._forecast_windows.set_max_batch_size(settings.max_batch_size)  # type: ignore[attr-defined]
        self._forecast_windows.set_batch_wait_timeout_s(settings.batch_wait_ms / 1000.0)  # type: ignore[attr-defined]

    async def check_health(self) -> None:
        """Serve's health check: cheap, and never on the model thread (see :mod:`distributed_onnx.serve.health`)."""
        if not self._health.ready:
            raise InferenceError(self._health.reason)

    # ------------------------------------------------------------------------------------------- health

    @api.get("/v2/health/live", summary="Liveness (Open Inference Protocol)")
    async def live(self) -> dict[str, bool]:
        return {"live": True}

    @api.get("/v2/health/ready", summary="Readiness: the model session is built, warm and healthy")
    async def ready(self) -> Response:
        if not self._health.ready:
            return JSONResponse({"error": f"not ready: {self._health.reason}"}, status_code=503)
        return JSONResponse({"ready": True})

    @api.get("/v2", summary="Server metadata (Open Inference Protocol)")
    async def server_metadata(self) -> dict[str, Any]:
        return {"name": APP_NAME, "version": api.version, "extensions": [EXTENSION]}

    # ------------------------------------------------------------------------------------------- models

    @api.get("/v2/models/{name}", response_model=ModelMetadata, responses=_ERRORS, summary="Model metadata")
    async def model_metadata(self, name: str) -> ModelMetadata:
        self._check_name(name)
        return ModelMetadata(
            name=self._name,
            inputs=[tensor_metadata(spec) for spec in self._input_specs],
            outputs=[tensor_metadata(spec) for spec in self._output_specs],
        )

    @api.get("/v2/models/{name}/ready", responses=_ERRORS, summary="Model readiness")
    async def model_ready(self, name: str) -> Response:
        self._check_name(name)
        return await self.ready()

    @api.post(
        "/v2/models/{name}/infer",
        response_model=InferResponse,
        responses=_ERRORS,
        openapi_extra=json_body(InferRequest),
        summary="Run the model on named tensors (Open Inference Protocol, JSON or binary tensor data)",
    )
    async def infer(self, name: str, request: Request) -> Response:
        return await self._observe("infer", self._infer, name, request)

    @api.post(
        "/v1/forecast",
        response_model=ForecastResponse,
        responses=_ERRORS,
        openapi_extra=json_body(ForecastRequest),
        summary="Quantile forecasts for one or many series",
    )
    async def forecast(self, request: Request) -> Response:
        return await self._observe("forecast", self._forecast, request)

    # ------------------------------------------------------------- KServe v2 over gRPC (grpc_messages)

    async def ServerLive(self, request: Any) -> Any:  # noqa: N802 - gRPC method names
        return ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any) -> Any:  # noqa: N802
        return ServerReadyResponse(ready=self._health.ready)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        return await self._grpc(grpc_context, ModelReadyResponse(), self._grpc_model_ready, request)

    async def ServerMetadata(self, request: Any) -> Any:  # noqa: N802
        return ServerMetadataResponse(name=APP_NAME, version=api.version, extensions=[])

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        return await self._grpc(grpc_context, ModelMetadataResponse(), self._grpc_model_metadata, request)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
        return await self._grpc(
            grpc_context, ModelInferResponse(), self._observe, "grpc_infer", self._grpc_infer, request
        )

    async def _grpc(self, context: Any, empty: Any, handler: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run a gRPC method; an error sets the status code (as Triton's) and the same message as over HTTP."""
        try:
            return await handler(*args)
        except Exception as exc:
            if status_of(exc) >= 500 and not isinstance(exc, HttpError | InferenceError | BackendClosedError):
                logger.exception("Unexpected error in a gRPC call")
            context.set_code(grpc_code(status_of(exc)))
            context.set_details(exc.message if isinstance(exc, HttpError) else f"{exc}")
            return empty

    async def _grpc_model_ready(self, request: Any) -> Any:
        self._check_name(request.name)
        return ModelReadyResponse(ready=self._health.ready)

    async def _grpc_model_metadata(self, request: Any) -> Any:
        return metadata_response(await self.model_metadata(request.name))

    async def _grpc_infer(self, request: Any) -> Any:
        self._check_name(request.model_name)
        size = request.ByteSize()
        if size > self._settings.max_body_bytes:
            raise HttpError(413, f"Request is {size} bytes, the limit is {self._settings.max_body_bytes} bytes.")
        if size > OFFLOAD_BODY_BYTES:
            call = await self._run_codec(self._plan_grpc_infer, request)
        else:
            call = self._plan_grpc_infer(request)
        started = time.perf_counter()
        outputs = await self._run_model(run_checked, self._worker.backend.run, call.inputs, call.names)
        self._metrics.compute("grpc_infer", (time.perf_counter() - started) * 1000.0)
        return model_infer_response(self._name, request.id, outputs, call.names)

    def _plan_grpc_infer(self, request: Any) -> InferCall:
        tensors, raw = infer_inputs(request)
        names = select_outputs((spec.name for spec in self._output_specs), requested_outputs(request))
        inputs = decode_inputs(tensors, self._input_specs, raw)
        self._worker.adapter.check_tensors(inputs)  # the same family NaN/inf rule as over HTTP
        return InferCall(inputs, names, set(), {})

    # ------------------------------------------------------------------------------------- internals

    async def _infer(self, name: str, request: Request) -> Response:
        self._check_name(name)
        body = await read_body(request, self._settings.max_body_bytes)
        header_length = request.headers.get(HEADER_LENGTH)
        if len(body) > OFFLOAD_BODY_BYTES:
            call = await self._run_codec(self._plan_infer, body, header_length)
        else:
            call = self._plan_infer(body, header_length)
        started = time.perf_counter()
        outputs = await self._run_model(run_checked, self._worker.backend.run, call.inputs, call.names)
        self._metrics.compute("infer", (time.perf_counter() - started) * 1000.0)
        if sum(outputs[name].size for name in call.names) > OFFLOAD_RESPONSE_VALUES:
            encoded = await self._run_codec(encode_response, call.document, outputs, call.names, call.binary)
        else:
            encoded = encode_response(call.document, outputs, call.names, call.binary)
        return infer_response(*encoded)

    def _plan_infer(self, body: bytes, header_length: str | None) -> InferCall:
        parsed, raw = parse_infer_request(body, header_length)
        names = select_outputs((spec.name for spec in self._output_specs), parsed.outputs)
        document: dict[str, Any] = {"model_name": self._name}
        if parsed.id is not None:
            document["id"] = parsed.id
        inputs = decode_inputs(parsed.inputs, self._input_specs, raw)
        self._worker.adapter.check_tensors(inputs)  # the family's NaN/inf rule (docs/design.md, Model families)
        return InferCall(inputs, names, binary_outputs(parsed, names), document)

    async def _forecast(self, request: Request) -> Response:
        body = await read_body(request, self._settings.max_body_bytes)
        if len(body) > OFFLOAD_BODY_BYTES:
            parsed, job = await self._run_codec(self._plan, body)
        else:
            parsed, job = self._plan(body)
        forecasts: np.ndarray
        # Batching off, or an idle replica (no model call running, none waiting to batch): go straight to the
        # model. Waiting to fill a batch only pays when others are queued; a lone client paid the wait plus
        # ~2.4 ms of Serve's batch machinery for nothing (3.4 ms p50 at batch_wait_ms=1 - measured here).
        direct = self._settings.max_batch_size == 1 or self._forecasts_in_flight == 0
        self._forecasts_in_flight += 1
        try:
            if direct:
                started = time.perf_counter()
                (forecasts,) = await self._run_model(
                    run_jobs, self._worker.forecast, [job], self._settings.rows_per_batch
                )
                compute_ms = (time.perf_counter() - started) * 1000.0
                self._metrics.batch([(started - job.enqueued_s) * 1000.0], compute_ms, len(job.context))
            else:
                forecasts = await self._forecast_windows(job)
        finally:
            self._forecasts_in_flight -= 1
        if forecasts.size > OFFLOAD_RESPONSE_VALUES:
            body = await self._run_codec(self._encode, parsed, forecasts, job)
        else:
            body = self._encode(parsed, forecasts, job)
        return Response(body, media_type="application/json")

    def _plan(self, body: bytes) -> tuple[ForecastRequest, ForecastJob]:
        parsed = parse_body(body, ForecastRequest)
        return parsed, plan_job(parsed, self._metadata, time.perf_counter())

    def _encode(self, parsed: ForecastRequest, forecasts: np.ndarray, job: ForecastJob) -> bytes:
        return encode_forecasts(self._name, parsed, forecasts, job.quantiles, self._metadata.resolution_minutes)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _forecast_windows(self, jobs: list[ForecastJob]) -> list[np.ndarray]:
        started = time.perf_counter()
        results = await self._run_model(run_jobs, self._worker.forecast, jobs, self._settings.rows_per_batch)
        finished = time.perf_counter()
        self._metrics.batch(
            [(started - job.enqueued_s) * 1000.0 for job in jobs],
            (finished - started) * 1000.0,
            sum(job.context.shape[0] for job in jobs),
        )
        return results

    async def _observe(self, endpoint: str, handler: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Admit (or refuse: overload), run and count one request; the code recorded is the HTTP status."""
        started = time.perf_counter()
        code = 500
        self._admitted += 1
        try:
            if self._admitted > self._settings.admission_limit:
                raise HttpError(
                    503,
                    f"Overloaded: this replica holds {self._settings.admission_limit} requests "
                    "(max_ongoing_requests + max_queued_requests); retry later.",
                    {"Retry-After": str(math.ceil(self._settings.retry_after_s))},
                )
            result = await handler(*args)
            code = getattr(result, "status_code", 200)
            return result
        except BaseException as exc:
            code = status_of(exc)
            raise
        finally:
            self._admitted -= 1
            self._metrics.request(endpoint, code, (time.perf_counter() - started) * 1000.0)

    async def _run_model(self, function: Callable[..., T], *args: Any) -> T:
        """Run a model call in the model thread and report its outcome to the replica's health."""
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._model_thread, function, *args)
        except (InferenceError, BackendClosedError) as exc:
            self._health.failed(exc)
            raise
        self._health.succeeded()
        return result

    async def _run_codec(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._codec_thread, function, *args)

    def _check_name(self, name: str) -> None:
        if name != self._name:
            raise HttpError(404, f"Unknown model {name!r}; this server serves {self._name!r}.")


def build_app(settings: ServeSettings) -> Any:
    """The Serve application (``serve.run(build_app(settings), route_prefix="/")``)."""
    deployment: Any = OnnxForecastServer  # a serve.Deployment once decorated; mypy sees the class
    return deployment.options(**settings.deployment_options()).bind(settings)


def app_builder(args: dict[str, Any]) -> Any:
    """Entry point of a Serve config file (``import_path: distributed_onnx.serve.app:app_builder``)."""
    return build_app(ServeSettings.from_sources(dict(args), source="Serve config args"))
