"""``GET /metrics``: the replica's own Prometheus text, from a registry of its own (not Ray's global one).

The one metrics system of the deployment (Serve's own ``serve_*`` metrics aside, which Ray exports on each node's
metrics port): what one replica can say about itself right now, scraped from the address clients use, without
Ray's metrics agent: requests by code, where their time went, the forecasts it served, those its shadow models
made, what its forecast log wrote and dropped (by reason). With several replicas each one answers for itself (a
scrape reaches one of them): sum over the ``replica`` label.

Where a request's time goes, per model (as Triton's ``nv_inference_queue_duration_us``,
``nv_inference_compute_infer_duration_us``...), so an operator sees whether to add replicas (time waiting) or
faster hardware (time computing): ``serialization`` (parsing and planning the body, encoding the response),
``batch_wait`` (a /v1 forecast waiting for ``@serve.batch`` to hand its batch over; none for v2 infer, which is
unbatched), ``queue`` (waiting for the model's one thread, behind other calls), ``compute`` (the model call). The
rest of ``request_duration`` is reading the body and the route itself.

prometheus_client comes with ``ray[serve]`` (Ray's own metrics use it); a registry of our own keeps these
series apart from whatever Ray registers in the process-global one.

- ``distributed_onnx_forecasts_served_total`` (``model``): forecasts (one per series) returned to clients;
- ``distributed_onnx_forecasts_shadow_total`` (``model``): forecasts a shadow model made (logged, never returned);
- ``distributed_onnx_forecasts_shadow_skipped_total`` (``model``): shadow forecasts skipped, the shadow being
  behind (see :class:`distributed_onnx.serve.log.traffic.LiveTraffic`);
- ``distributed_onnx_forecasts_shadow_failed_total`` (``model``, ``reason``): windows a shadow model did not
  forecast (``error``: its call failed) or forecast NaN or inf for (``nonfinite``: logged, never scored);
- ``distributed_onnx_forecasts_logged_total`` (``model``): forecasts whose log file was written;
- ``distributed_onnx_forecasts_dropped_total`` (``model``, ``reason``): forecasts the log dropped
  (``queue_full``: the sink was slower than the traffic; ``write_failed``: the sink failed);
- ``distributed_onnx_forecast_log_pending`` (``model``): forecasts queued for the log, not yet written;
- ``distributed_onnx_request_duration_seconds`` (``endpoint``, ``model``): handler time, histogram;
- ``distributed_onnx_requests_total`` (``endpoint``, ``model``, ``code``): requests answered, by HTTP status (the
  one a gRPC status maps from);
- ``distributed_onnx_{serialization,batch_wait,queue,compute}_duration_seconds`` (``model``): histograms, one
  observation per request (a batched request observes its batch's queue and compute);
- ``distributed_onnx_batch_requests`` / ``distributed_onnx_batch_windows`` (``model``): histograms, requests and
  series (windows) per model call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: Seconds; from 0.5 ms (a warm small request) to 10 s (a request near the default timeout).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: Finer at the low end for the parts of a request (a small request's serialization takes tens of microseconds).
PHASE_BUCKETS_S = (0.00005, 0.0001, 0.0002, *LATENCY_BUCKETS_S)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: The parts of a request's time, each a histogram ``distributed_onnx_<phase>_duration_seconds``.
PHASES = ("serialization", "batch_wait", "queue", "compute")


@dataclass(frozen=True)
class ModelCall:
    """How long one model call waited for the model's thread and how long it ran."""

    queue_s: float
    compute_s: float


class LogCounts(Protocol):
    """What the page reads of a log's counts (:class:`distributed_onnx.live.log.writer.ModelCounts`)."""

    @property
    def logged(self) -> int: ...

    @property
    def dropped(self) -> dict[str, int]: ...

    @property
    def pending(self) -> int: ...


class CountingLog(Protocol):
    def counts(self) -> Mapping[str, LogCounts]: ...


class _LogCollector(Collector):
    """Reads the log's counts at scrape time (the writer thread keeps them; nothing on the request path)."""

    def __init__(self, log: CountingLog, replica: str) -> None:
        self._log = log
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        counts = self._log.counts()
        logged = CounterMetricFamily(
            "distributed_onnx_forecasts_logged", "Forecasts written to the forecast log.", labels=["model", "replica"]
        )
        dropped = CounterMetricFamily(
            "distributed_onnx_forecasts_dropped",
            "Forecasts the forecast log dropped, by reason (queue_full, write_failed).",
            labels=["model", "reason", "replica"],
        )
        pending = GaugeMetricFamily(
            "distributed_onnx_forecast_log_pending",
            "Forecasts queued for the forecast log, not yet written.",
            labels=["model", "replica"],
        )
        for model, count in sorted(counts.items()):
            logged.add_metric([model, self._replica], count.logged)
            for reason, value in sorted(count.dropped.items()):
                dropped.add_metric([model, reason, self._replica], value)
            pending.add_metric([model, self._replica], count.pending)
        yield from (logged, dropped, pending)


class LiveMetrics:
    """The replica's ``/metrics`` page."""

    def __init__(self, log: CountingLog | None = None, replica: str | None = None) -> None:
        self.replica = replica or str(os.getpid())
        self.registry = CollectorRegistry()

        # Every series of the page carries the replica's label (sum over it: the module docstring).
        def counter(name: str, documentation: str, labels: Sequence[str] = ("model",)) -> Counter:
            return Counter(name, documentation, [*labels, "replica"], registry=self.registry)

        def histogram(
            name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ("model",)
        ) -> Histogram:
            return Histogram(name, documentation, [*labels, "replica"], buckets=buckets, registry=self.registry)

        self._served = counter("distributed_onnx_forecasts_served", "Forecasts (one per series) returned to clients.")
        self._shadow = counter(
            "distributed_onnx_forecasts_shadow", "Forecasts made by a shadow model (logged, never returned)."
        )
        self._shadow_skipped = counter(
            "distributed_onnx_forecasts_shadow_skipped",
            "Shadow forecasts skipped because too many answers' shadow work was already waiting.",
        )
        self._shadow_failed = counter(
            "distributed_onnx_forecasts_shadow_failed",
            "Windows a shadow model failed to forecast (error) or forecast NaN or inf for (nonfinite).",
            ("model", "reason"),
        )
        self._latency = histogram(
            "distributed_onnx_request_duration_seconds",
            "Handler time of a request, body read to response.",
            LATENCY_BUCKETS_S,
            ("endpoint", "model"),
        )
        self._requests = counter(
            "distributed_onnx_requests",
            "Requests answered, by endpoint, model and HTTP status code.",
            ("endpoint", "model", "code"),
        )
        self._phases = {
            phase: histogram(
                f"distributed_onnx_{phase}_duration_seconds",
                f"Time of a request spent in {phase.replace('_', ' ')} (see the module docstring).",
                PHASE_BUCKETS_S,
            )
            for phase in PHASES
        }
        self._batch_requests = histogram("distributed_onnx_batch_requests", "Requests per model call.", BATCH_BUCKETS)
        self._batch_windows = histogram(
            "distributed_onnx_batch_windows", "Series (windows) per model call.", BATCH_BUCKETS
        )
        if log is not None:
            self.registry.register(_LogCollector(log, self.replica))

    def served(self, model: str, forecasts: int) -> None:
        self._served.labels(model, self.replica).inc(forecasts)

    def shadow(self, model: str, forecasts: int) -> None:
        self._shadow.labels(model, self.replica).inc(forecasts)

    def shadow_skipped(self, model: str, forecasts: int) -> None:
        self._shadow_skipped.labels(model, self.replica).inc(forecasts)

    def shadow_failed(self, model: str, windows: int, reason: str) -> None:
        """``reason``: ``error`` (the shadow's call failed) or ``nonfinite`` (NaN or inf forecasts)."""
        self._shadow_failed.labels(model, reason, self.replica).inc(windows)

    def request(self, endpoint: str, model: str, seconds: float, code: int = 200) -> None:
        self._latency.labels(endpoint, model, self.replica).observe(seconds)
        self._requests.labels(endpoint, model, str(code), self.replica).inc()

    def serialization(self, model: str, seconds: float) -> None:
        self._phases["serialization"].labels(model, self.replica).observe(seconds)

    def model_call(self, model: str, batch_waits_s: Sequence[float], call: ModelCall, windows: int) -> None:
        """One model call for ``windows`` series: the batch wait of each of its batched requests (none: a v2
        call), and its queue and compute, observed once per request."""
        requests = max(1, len(batch_waits_s))
        for wait in batch_waits_s:
            self._phases["batch_wait"].labels(model, self.replica).observe(wait)
        for phase, seconds in (("queue", call.queue_s), ("compute", call.compute_s)):
            histogram = self._phases[phase].labels(model, self.replica)
            for _ in range(requests):
                histogram.observe(seconds)
        self._batch_requests.labels(model, self.replica).observe(requests)
        self._batch_windows.labels(model, self.replica).observe(windows)

    def render(self) -> tuple[bytes, str]:
        """The page and its content type (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
