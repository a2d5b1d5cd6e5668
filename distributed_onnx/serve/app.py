"""The Serve deployment: one replica = one pinned :class:`InferenceWorker` behind a FastAPI ingress.

Each replica builds :class:`distributed_onnx.actors.PinnedWorker` in ``__init__``, the body of the backtest's
actors, so provider handling, GPU pinning, thread sizing and warm-up are the same code. Routes:

- ``/v1/forecast``: validated in the ingress (a bad request fails alone), then, unless the replica is idle
  (then it runs at once), merged with concurrent requests by one ``@serve.batch`` method into one
  :meth:`InferenceWorker.forecast` call per distinct
  (horizon, quantiles), run in the replica's model thread (ORT releases the GIL), split back per request.
- Open Inference Protocol (KServe v2): ``/v2/health/{live,ready}``, ``/v2``, ``/v2/models/{name}``,
  ``/v2/models/{name}/ready``, ``/v2/models/{name}/infer``. Infer requests run *unbatched*: concatenating
  requests along axis 0 is not semantics-preserving for every graph (Chronos-2's ``group_ids`` would merge
  the groups of different requests), so each request is one ``backend.run`` in the model thread. Tensor data
  is JSON or binary (Triton's binary tensor data extension, :mod:`distributed_onnx.serve.binary`), which is
  what ``tritonclient.http`` sends and asks for by default.

Bodies are read by the routes themselves so the size limit (413) applies before any parsing.
"""

# No ``from __future__ import annotations`` here: Serve pickles the FastAPI app to the replicas, and route
# annotations left as strings come back as unresolvable ForwardRefs there (/openapi.json failed - measured).
import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from ray import serve

from distributed_onnx.actors import PinnedWorker
from distributed_onnx.errors import ConfigError, InferenceError
from distributed_onnx.serve.binary import EXTENSION, binary_outputs, encode_response
from distributed_onnx.serve.forecasting import ForecastJob, encode_forecasts, plan_job, run_jobs
from distributed_onnx.serve.http import (
    HttpError,
    infer_response,
    install_error_handlers,
    install_openapi_models,
    json_body,
    parse_body,
    read_body,
    read_infer_request,
    status_of,
)
from distributed_onnx.serve.protocol import decode_inputs, select_outputs, tensor_metadata
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

T = TypeVar("T")

APP_NAME = "distributed_onnx"
DEPLOYMENT_NAME = "OnnxForecastServer"
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 500, 503)}

api = FastAPI(
    title="distributed_onnx",
    description="Quantile forecasts from an ONNX checkpoint: /v1/forecast and the Open Inference Protocol (v2).",
    version="0.1.0",
)
install_error_handlers(api)
install_openapi_models(api, [ForecastRequest, InferRequest])


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress(api)
class OnnxForecastServer:
    """A replica: one pinned worker, its batch queue and its metrics."""

    def __init__(self, settings: ServeSettings) -> None:
        self._settings = settings
        self._worker = PinnedWorker(settings.worker_config(), settings.cpus_per_replica).worker
        self._metadata = self._worker.metadata
        self._name = self._worker.model_name
        backend = self._worker.backend
        if not hasattr(backend, "input_specs") or not hasattr(backend, "output_specs"):
            raise ConfigError(f"backend {type(backend).__name__} does not describe its tensors (input_specs)")
        self._input_specs = list(backend.input_specs)
        self._output_specs = list(backend.output_specs)
        self._metrics = ServeMetrics()
        # One thread runs every model call (forecast batches, v2 infer, health checks) off the event loop, so
        # the session sees one call at a time with the threads PinnedWorker sized for this replica's CPUs,
        # rather than asyncio's default pool oversubscribing them.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnx")
        self._ready = True
        self._forecasts_in_flight = 0  # /v1/forecast requests between validation and their result
        self._forecast_windows.set_max_batch_size(settings.max_batch_size)  # type: ignore[attr-defined]
        self._forecast_windows.set_batch_wait_timeout_s(settings.batch_wait_ms / 1000.0)  # type: ignore[attr-defined]

    async def check_health(self) -> None:
        """Serve's health check: a one-series forecast must run, or the replica is replaced."""
        probe = np.zeros((1, 1), dtype=np.float32)
        try:
            await self._run_model(self._worker.forecast, probe, 1, (0.5,))
        except Exception:
            self._ready = False
            raise
        self._ready = True

    # ------------------------------------------------------------------------------------------- health

    @api.get("/v2/health/live", summary="Liveness (Open Inference Protocol)")
    async def live(self) -> dict[str, bool]:
        return {"live": True}

    @api.get("/v2/health/ready", summary="Readiness: the model session is built, warm and healthy")
    async def ready(self) -> Response:
        if not self._ready:
            return JSONResponse({"error": "the model failed its last health check"}, status_code=503)
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

    # ------------------------------------------------------------------------------------- internals

    async def _infer(self, name: str, request: Request) -> Response:
        self._check_name(name)
        parsed, raw = await read_infer_request(request, self._settings.max_body_bytes)
        inputs = decode_inputs(parsed.inputs, self._input_specs, raw)
        self._worker.adapter.check_tensors(inputs)  # the family's NaN/inf rule (DESIGN.md, Model families)
        names = select_outputs((spec.name for spec in self._output_specs), parsed.outputs)
        binary = binary_outputs(parsed, names)
        started = time.perf_counter()
        outputs = await self._run_model(self._worker.backend.run, inputs)
        broken = [name for name in names if outputs[name].dtype.kind == "f" and not np.isfinite(outputs[name]).all()]
        if broken:
            raise InferenceError(f"the model produced NaN or infinite values in output(s) {broken}")
        self._metrics.compute("infer", (time.perf_counter() - started) * 1000.0)
        document: dict[str, Any] = {"model_name": self._name}
        if parsed.id is not None:
            document["id"] = parsed.id
        return infer_response(*encode_response(document, outputs, names, binary))

    async def _forecast(self, request: Request) -> Response:
        parsed = parse_body(await read_body(request, self._settings.max_body_bytes), ForecastRequest)
        job = plan_job(parsed, self._metadata, time.perf_counter())
        forecasts: np.ndarray
        # Batching off, or an idle replica (no model call running, none waiting to batch): go straight to the
        # model. Waiting to fill a batch only pays when others are queued; a lone client paid the wait plus
        # ~2.4 ms of Serve's batch machinery for nothing (3.4 ms p50 at batch_wait_ms=1 - measured here).
        direct = self._settings.max_batch_size == 1 or self._forecasts_in_flight == 0
        self._forecasts_in_flight += 1
        try:
            if direct:
                started = time.perf_counter()
                (forecasts,) = await self._run_model(run_jobs, self._worker.forecast, [job])
                compute_ms = (time.perf_counter() - started) * 1000.0
                self._metrics.batch([(started - job.enqueued_s) * 1000.0], compute_ms, len(job.context))
            else:
                forecasts = await self._forecast_windows(job)
        finally:
            self._forecasts_in_flight -= 1
        body = encode_forecasts(self._name, parsed, forecasts, job.quantiles, self._metadata.resolution_minutes)
        return Response(body, media_type="application/json")

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _forecast_windows(self, jobs: list[ForecastJob]) -> list[np.ndarray]:
        started = time.perf_counter()
        results = await self._run_model(run_jobs, self._worker.forecast, jobs)
        finished = time.perf_counter()
        self._metrics.batch(
            [(started - job.enqueued_s) * 1000.0 for job in jobs],
            (finished - started) * 1000.0,
            sum(job.context.shape[0] for job in jobs),
        )
        return results

    async def _observe(self, endpoint: str, handler: Callable[..., Awaitable[Response]], *args: Any) -> Response:
        started = time.perf_counter()
        code = 500
        try:
            response = await handler(*args)
            code = response.status_code
            return response
        except BaseException as exc:
            code = status_of(exc)
            raise
        finally:
            self._metrics.request(endpoint, code, (time.perf_counter() - started) * 1000.0)

    async def _run_model(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._model_thread, function, *args)

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
