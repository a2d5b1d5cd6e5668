"""The replica's core, without Serve: admission, threads, health and request planning for one model.

:class:`ModelCore` owns one :class:`InferenceWorker` (one ONNX Runtime session) and everything a request to it needs:
its model thread, its readiness (:mod:`distributed_onnx.serve.operations.health`), the planning of ``/v1/forecast``
requests and the answers to them and to v2 infer requests (HTTP and gRPC; planned by
:mod:`distributed_onnx.serve.infer_call`). :class:`ReplicaCore` owns what the replica's models share: admission
(requests counted and their memory charged, :mod:`distributed_onnx.serve.operations.admission`), the codec thread, the
metrics (:class:`~distributed_onnx.serve.operations.metrics.LiveMetrics`: each request's time split into serialization,
batch wait, queue and compute, per model), and the models by name. The Serve deployment
(:mod:`distributed_onnx.serve.app`) is a thin shell over it: its HTTP routes and gRPC methods delegate here, and its
``@serve.batch`` method is the ``batcher`` a core merges forecasts with, so the whole request path is testable with a
fake batcher.

- ``/v1/forecast``: planned in the codec thread when large (:data:`OFFLOAD_BODY_BYTES`), then run at once when
  the replica is idle (no model call running, none waiting to batch), else handed to the batcher, which merges
  concurrent requests into model calls of at most ``rows_per_batch`` windows. A failing model call fails every
  request of its batch (500, counted by health); a request whose values make the model emit NaN or inf fails
  alone (422) and does not count against readiness: the session works, the values are out of its range.
- v2 infer (HTTP and gRPC) runs *unbatched*: concatenating requests along axis 0 is not semantics-preserving
  for every graph (Chronos-2's ``group_ids`` would merge the groups of different requests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from distributed_onnx.errors import BackendClosedError, InferenceError
from distributed_onnx.model.quantiles import clamped_levels
from distributed_onnx.model.worker import InferenceWorker
from distributed_onnx.serve.infer_call import InferCall, InferServed, plan_grpc, plan_http
from distributed_onnx.serve.operations.admission import Admission, Ticket
from distributed_onnx.serve.operations.health import ModelHealth
from distributed_onnx.serve.operations.metrics import LiveMetrics, ModelCall
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.binary import encode_response
from distributed_onnx.serve.wire.forecasting import (
    ForecastJob,
    check_finite_forecasts,
    encode_forecasts,
    plan_job,
    run_jobs,
)
from distributed_onnx.serve.wire.grpc_api import check_response_fits, model_infer_response
from distributed_onnx.serve.wire.http import HttpError, parse_body, status_of
from distributed_onnx.serve.wire.protocol import run_checked, tensor_metadata
from distributed_onnx.serve.wire.schemas import ForecastRequest, ModelMetadata

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: Bodies above this are parsed (and their histories built) in the codec thread, off the event loop that runs
#: the other requests and the batch timer. Below it parsing inline is cheaper than the hop to the thread (both
#: profiled once when this was set; the requests' latency it serves: benchmarks/results/serve.md).
OFFLOAD_BODY_BYTES = 64 * 1024
#: Responses with more forecast values than this are encoded in the codec thread (a large response's encoding
#: would otherwise hold the event loop for longer than the hop costs).
OFFLOAD_RESPONSE_VALUES = 4096


class ModelSource(Protocol):
    """Where models beyond those every replica holds come from (:class:`.repository.ModelRepository`)."""

    async def model(self, name: str) -> Any: ...

    def has(self, name: str) -> bool: ...

    def knows(self, name: str) -> bool: ...


#: Merges a forecast job with concurrent ones (the deployment's ``@serve.batch`` method) and returns its result.
Batcher = Callable[[ForecastJob], Awaitable[np.ndarray]]


@dataclass(frozen=True)
class ForecastAnswer:
    """A /v1/forecast answer: the body sent, and the model, request and forecasts behind it (for the log)."""

    body: bytes
    model: ModelCore
    parsed: ForecastRequest
    forecasts: np.ndarray
    quantiles: tuple[float, ...]


@dataclass(frozen=True)
class InferAnswer:
    """A v2 infer answer over HTTP: the body, its binary header length (``None``: JSON), what the log takes."""

    body: bytes
    header_length: int | None
    served: InferServed


class ModelCore:
    """One model in a replica: its worker, model thread, health and the planning and running of its requests."""

    def __init__(
        self,
        worker: InferenceWorker,
        settings: ServeSettings,
        replica: ReplicaCore,
        *,
        shadow: bool = False,
        checkpoint_sha256: str = "",
    ) -> None:
        self.worker = worker
        self.settings = settings
        self.name = worker.model_name
        self.metadata = worker.metadata
        #: A shadow forecasts the requests other models answer (after the answer, :mod:`.live_log`); its health
        #: does not make the replica unready, so a broken challenger never takes the champion down.
        self.shadow = shadow
        self.checkpoint_sha256 = checkpoint_sha256 or worker.metadata.sha256 or ""
        self.input_specs = list(worker.backend.input_specs)
        self.output_specs = list(worker.backend.output_specs)
        self.health = ModelHealth(settings.max_consecutive_model_failures)
        self._replica = replica
        self._batcher: Batcher | None = None
        # One thread runs every model call (forecast batches, v2 infer) off the event loop, so the session sees
        # one call at a time with the threads PinnedWorker sized for this replica's CPUs, rather than asyncio's
        # default pool oversubscribing them.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnx")
        self._forecasts_in_flight = 0  # /v1/forecast requests between validation and their result

    def set_batcher(self, batcher: Batcher | None) -> None:
        """Merge concurrent forecasts through ``batcher`` (``None``: every forecast is its own model call)."""
        self._batcher = batcher

    def release(self) -> None:
        """Let go of what refers back to this model (a repository model evicted from its replica's LRU).

        The deployment's batcher is a closure over this model: a reference cycle, which only the collector's
        rare full passes free, so evicted sessions piled up in a replica (measured: 1 GiB after 80 loads of a
        4 MiB checkpoint with 8 held). Requests still running on it finish unbatched.
        """
        self._batcher = None

    # ------------------------------------------------------------------------------------------ metadata

    def model_metadata(self) -> ModelMetadata:
        return ModelMetadata(
            name=self.name,
            inputs=[tensor_metadata(spec) for spec in self.input_specs],
            outputs=[tensor_metadata(spec) for spec in self.output_specs],
        )

    # ------------------------------------------------------------------------------------------ /v1/forecast

    @property
    def resolution_minutes(self) -> int:
        return self.metadata.resolution_minutes

    @property
    def native_quantiles(self) -> tuple[float, ...]:
        """The levels the model predicts: what the forecast log records a request's clamped levels against."""
        return tuple(self.metadata.native_quantiles)

    @property
    def context_length(self) -> int:
        """The steps of history the model reads: what the forecast log records for the seasonal-quantile baseline."""
        return self.metadata.context_length

    async def forecast(self, body: bytes, ticket: Ticket) -> bytes:
        """The JSON answer to a /v1/forecast body (already read under ``ticket``), from this model."""
        started = time.perf_counter()
        parsed, job = await self._replica.run_codec(self.plan_forecast, body, offload=len(body) > OFFLOAD_BODY_BYTES)
        return (await self.answer(parsed, job, ticket, time.perf_counter() - started)).body

    async def answer(
        self, parsed: ForecastRequest, job: ForecastJob, ticket: Ticket, parse_s: float = 0.0
    ) -> ForecastAnswer:
        """Forecast a planned request and encode the answer (kept with what the forecast log needs).

        ``parse_s``: the time its body took to parse and plan, counted with the encoding as its serialization.
        """
        ticket.charge_response(job.context.shape[0] * job.horizon * len(job.quantiles))
        forecasts = await self._compute(job)
        check_finite_forecasts(forecasts, parsed)
        started = time.perf_counter()
        large = forecasts.size > OFFLOAD_RESPONSE_VALUES
        body = await self._replica.run_codec(self.encode_forecast, parsed, forecasts, job, offload=large)
        self._replica.metrics.serialization(self.name, parse_s + time.perf_counter() - started)
        return ForecastAnswer(body, self, parsed, forecasts, job.quantiles)

    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        """This model's forecast of a request another model answered (planned for this model's own grid).

        Planned in a thread, not on the event loop (a large request's plan took hundreds of milliseconds there);
        NaN or inf forecasts are returned as they are, for the log to count (:mod:`.live_log`).
        """
        job = await asyncio.to_thread(plan_job, request, self.metadata, time.perf_counter())
        return await self._compute(job), job.quantiles

    async def _compute(self, job: ForecastJob) -> np.ndarray:
        """The job's forecasts, from a model call of its own or merged with concurrent ones by the batcher."""
        # Batching off, or an idle replica (no model call running, none waiting to batch): go straight to the
        # model. Waiting to fill a batch only pays when others are queued; a lone client paid the wait plus
        # Serve's batch machinery for nothing (batching on and off at 1 client: benchmarks/results/serve.md).
        direct = self._batcher is None or self.settings.max_batch_size == 1 or self._forecasts_in_flight == 0
        self._forecasts_in_flight += 1
        try:
            if direct or self._batcher is None:
                started = time.perf_counter()
                (forecasts,), call = await self.run_timed(
                    run_jobs, self.worker.forecast, [job], self.settings.rows_per_batch
                )
                self._replica.metrics.model_call(self.name, [started - job.enqueued_s], call, len(job.context))
            else:
                forecasts = await self._batcher(job)
        finally:
            self._forecasts_in_flight -= 1
        return forecasts

    def plan_forecast(self, body: bytes) -> tuple[ForecastRequest, ForecastJob]:
        parsed = parse_body(body, ForecastRequest)
        return parsed, plan_job(parsed, self.metadata, time.perf_counter())

    def encode_forecast(self, parsed: ForecastRequest, forecasts: np.ndarray, job: ForecastJob) -> bytes:
        clamped = clamped_levels(job.quantiles, self.metadata.native_quantiles)
        return encode_forecasts(
            self.name, parsed, forecasts, job.quantiles, self.metadata.resolution_minutes, clamped=clamped
        )

    async def run_batch(self, jobs: list[ForecastJob]) -> list[np.ndarray]:
        """One merged batch of forecast jobs (what the deployment's ``@serve.batch`` method runs)."""
        started = time.perf_counter()
        results, call = await self.run_timed(run_jobs, self.worker.forecast, jobs, self.settings.rows_per_batch)
        self._replica.metrics.model_call(
            self.name, [started - job.enqueued_s for job in jobs], call, sum(job.context.shape[0] for job in jobs)
        )
        return results

    # ------------------------------------------------------------------------------------------ v2 infer

    async def infer(self, body: bytes, header_length: str | None) -> InferAnswer:
        """A v2 infer request over HTTP: the response body, its binary header length and what the log takes."""
        codec = self._replica.run_codec
        started = time.perf_counter()
        call = await codec(plan_http, self, body, header_length, offload=len(body) > OFFLOAD_BODY_BYTES)
        parse_s = time.perf_counter() - started
        outputs = await self._run_infer(call)
        started = time.perf_counter()
        large = sum(outputs[name].size for name in call.names) > OFFLOAD_RESPONSE_VALUES
        encoded = await codec(encode_response, call.document, outputs, call.names, call.binary, offload=large)
        self._replica.metrics.serialization(self.name, parse_s + time.perf_counter() - started)
        return InferAnswer(*encoded, InferServed(self, call.windows, outputs, call.request_id))

    async def grpc_infer(self, request: Any, ticket: Ticket) -> tuple[Any, InferServed]:
        """A ``ModelInferResponse`` for a ``ModelInferRequest`` (gRPC parsed it, within its message limit)."""
        size = request.ByteSize()
        if size > self.settings.max_body_bytes:
            raise HttpError(413, f"Request is {size} bytes, the limit is {self.settings.max_body_bytes} bytes.")
        ticket.charge_body(size)
        started = time.perf_counter()
        call = await self._replica.run_codec(plan_grpc, self, request, offload=size > OFFLOAD_BODY_BYTES)
        parse_s = time.perf_counter() - started
        outputs = await self._run_infer(call)
        started = time.perf_counter()
        response = model_infer_response(self.name, request.id, outputs, call.names)
        check_response_fits(response)
        self._replica.metrics.serialization(self.name, parse_s + time.perf_counter() - started)
        return response, InferServed(self, call.windows, outputs, call.request_id)

    async def _run_infer(self, call: InferCall) -> Mapping[str, np.ndarray]:
        """A v2 call: its own model call (unbatched, so no batch wait is recorded)."""
        outputs, timing = await self.run_timed(run_checked, self.worker.backend.run, call.inputs, call.names)
        self._replica.metrics.model_call(self.name, [], timing, call.windows.count)
        return outputs

    # ------------------------------------------------------------------------------------------ model thread

    async def run_timed(self, function: Callable[..., T], *args: Any) -> tuple[T, ModelCall]:
        """Run a model call in the model thread, report its outcome to the model's health, and say how long the
        call waited for the model thread and how long it ran.

        An :class:`InputValidationError` from inside the call (outputs NaN or inf for this request's values)
        is the request's fault, not the session's: it neither counts as a failure nor as a success.
        """
        submitted = time.perf_counter()
        times = [submitted, submitted]

        def timed() -> T:
            times[0] = time.perf_counter()
            try:
                return function(*args)
            finally:
                times[1] = time.perf_counter()

        try:
            result = await asyncio.get_running_loop().run_in_executor(self._model_thread, timed)
        except (InferenceError, BackendClosedError) as exc:
            self.health.failed(exc)
            raise
        self.health.succeeded()
        return result, ModelCall(queue_s=times[0] - submitted, compute_s=times[1] - times[0])


class ReplicaCore:
    """What one replica's models share: admission, the codec thread, metrics; the models by name."""

    def __init__(self, settings: ServeSettings, metrics: LiveMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.admission = Admission(
            max_requests=settings.admission_limit,
            max_bytes=settings.max_request_memory_bytes,
            retry_after_s=settings.retry_after_s,
        )
        self.models: dict[str, ModelCore] = {}
        #: The checkpoint repository's models, loaded on first use (:mod:`.repository`); None without one.
        self.repository: ModelSource | None = None
        # Parses and encodes large bodies (OFFLOAD_*), off the event loop and off the model threads.
        self._codec_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec")

    def add_model(
        self,
        worker: InferenceWorker,
        settings: ServeSettings | None = None,
        *,
        shadow: bool = False,
        checkpoint_sha256: str = "",
    ) -> ModelCore:
        core = ModelCore(worker, settings or self.settings, self, shadow=shadow, checkpoint_sha256=checkpoint_sha256)
        self.models[core.name] = core
        return core

    @property
    def default_model(self) -> ModelCore:
        """The model of a /v1/forecast request that names none: the first added that is not a shadow."""
        found = next((model for model in self.models.values() if not model.shadow), None)
        if found is None:  # a repository alone
            raise HttpError(
                422,
                "Name the model: this server serves a model repository, and a request names its checkpoint in "
                "the body's `model` field or the serve_multiplexed_model_id header.",
            )
        return found

    @property
    def shadows(self) -> list[ModelCore]:
        return [model for model in self.models.values() if model.shadow]

    async def forecast(
        self,
        body: bytes,
        ticket: Ticket,
        header_model: str | None = None,
        on_model: Callable[[str], None] | None = None,
    ) -> ForecastAnswer:
        """A /v1/forecast body answered by the model it names (``model``; else ``header_model``, the
        ``serve_multiplexed_model_id`` header; else :attr:`default_model`).

        ``on_model`` is told the model's name once the body names one this server has (a repository model's once
        it is listed, so a failure to load it is that model's too): a failure after that, planning included, is
        that model's in the forecast log's failures table.
        """
        started = time.perf_counter()
        large = len(body) > OFFLOAD_BODY_BYTES
        model, parsed, job = await self.run_codec(self.plan_forecast, body, header_model, on_model, offload=large)
        if model is None or job is None:  # a repository model: found (loaded if need be), then planned
            name = parsed.model or header_model
            try:
                model = await self.find_model(name)
            finally:  # listed by now: a checkpoint that failed to load is named too
                if on_model is not None and name is not None and self._knows(name):
                    on_model(name)
            job = await self.run_codec(plan_job, parsed, model.metadata, time.perf_counter(), offload=large)
        return await model.answer(parsed, job, ticket, time.perf_counter() - started)

    def plan_forecast(
        self, body: bytes, header_model: str | None = None, on_model: Callable[[str], None] | None = None
    ) -> tuple[ModelCore | None, ForecastRequest, ForecastJob | None]:
        """Parse and plan for a model every replica holds; ``(None, parsed, None)`` for a repository model."""
        parsed = parse_body(body, ForecastRequest)
        name = parsed.model or header_model
        if name is not None and name not in self.models and self.repository is not None:
            return None, parsed, None
        model = self.model(name) if name is not None else self.default_model
        if on_model is not None:
            on_model(model.name)
        return model, parsed, plan_job(parsed, model.metadata, time.perf_counter())

    def model(self, name: str) -> ModelCore:
        """The model called ``name`` among those every replica holds, or 404 naming the ones served."""
        try:
            return self.models[name]
        except KeyError:
            served = ", ".join(repr(known) for known in self.models)
            raise HttpError(404, f"Unknown model {name!r}; this server serves {served}.") from None

    def _knows(self, name: str) -> bool:
        return name in self.models or (self.repository is not None and self.repository.knows(name))

    async def find_model(self, name: str | None) -> ModelCore:
        """The model called ``name``: held by every replica, else the repository's (loaded on first use)."""
        if name is None:
            return self.default_model
        if name in self.models or self.repository is None:
            return self.model(name)
        model: ModelCore = await self.repository.model(name)
        return model

    @property
    def ready(self) -> bool:
        """Every model that answers requests is ready (shadows report their own readiness only)."""
        return all(model.health.ready for model in self.models.values() if not model.shadow)

    @property
    def not_ready_reason(self) -> str:
        return "; ".join(
            f"{model.name}: {model.health.reason}"
            for model in self.models.values()
            if not model.shadow and not model.health.ready
        )

    async def observe(
        self, endpoint: str, handler: Callable[[Ticket], Awaitable[T]], model: Callable[[], str] = lambda: "-"
    ) -> T:
        """Admit (or refuse: overload), run, count and time one request; the code recorded is the HTTP status.

        ``handler`` gets the request's admission ticket, to charge its body and response before it holds them;
        ``model()`` names the model the request reached once it is done (``-``: none, or an unknown name).
        """
        started = time.perf_counter()
        code = 500
        try:
            with self.admission.enter() as ticket:
                result = await handler(ticket)
            code = getattr(result, "status_code", 200)
            return result
        except BaseException as exc:
            code = status_of(exc)
            raise
        finally:
            self.metrics.request(endpoint, model(), time.perf_counter() - started, code)

    async def run_codec(self, function: Callable[..., T], *args: Any, offload: bool = True) -> T:
        """``function(*args)`` in the codec thread, or inline when not ``offload`` (below :data:`OFFLOAD_BODY_BYTES`
        and :data:`OFFLOAD_RESPONSE_VALUES` the hop costs more than it spares the event loop)."""
        if not offload:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self._codec_thread, function, *args)
