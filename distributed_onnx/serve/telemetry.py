"""Prometheus metrics of the deployment, through Ray's metrics export (``ray.serve.metrics``).

Ray exports them with a ``ray_`` prefix (counters also get ``_total``) on each node's metrics port, next
to Serve's own (``ray_serve_num_http_requests_total``, ``ray_serve_http_request_latency_ms``,
``ray_serve_deployment_processing_latency_ms``, ``ray_serve_actual_batch_size``,
``ray_serve_batch_wait_time_ms``, ``ray_serve_batch_execution_time_ms``). Ours, per replica:

- ``distributed_onnx_requests`` (counter; ``endpoint``, ``code``): requests answered, by status code;
- ``distributed_onnx_request_errors`` (counter; ``endpoint``, ``code``): the 4xx/5xx among them;
- ``distributed_onnx_request_latency_ms`` (histogram; ``endpoint``): handler time, body read to response;
- ``distributed_onnx_queue_ms`` (histogram): a forecast's wait in the batch queue before its model call;
- ``distributed_onnx_compute_ms`` (histogram; ``endpoint``): the model call (pre/post-processing included);
- ``distributed_onnx_batch_requests`` / ``distributed_onnx_batch_windows`` (histograms): realized batch
  size in requests and in series (windows) per model call.
"""

from __future__ import annotations

from typing import Any

_LATENCY_MS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0]
_BATCH = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0]
# Ray annotates tag_keys as Tuple[str] (one element) though it takes any number.
_BY_CODE: Any = ("endpoint", "code")


class ServeMetrics:
    """The replica's metric objects, created inside the replica (Ray metrics need a running worker)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        self._requests: Any = Counter(
            "distributed_onnx_requests",
            description="Requests answered, by endpoint and status code.",
            tag_keys=_BY_CODE,
        )
        self._errors: Any = Counter(
            "distributed_onnx_request_errors",
            description="Requests answered with a 4xx or 5xx.",
            tag_keys=_BY_CODE,
        )
        self._latency: Any = Histogram(
            "distributed_onnx_request_latency_ms",
            description="Handler latency (ms).",
            boundaries=_LATENCY_MS,
            tag_keys=("endpoint",),
        )
        self._queue: Any = Histogram(
            "distributed_onnx_queue_ms",
            description="Wait in the batch queue before the model call (ms).",
            boundaries=_LATENCY_MS,
        )
        self._compute: Any = Histogram(
            "distributed_onnx_compute_ms",
            description="Model call incl. pre/post-processing (ms).",
            boundaries=_LATENCY_MS,
            tag_keys=("endpoint",),
        )
        self._batch_requests: Any = Histogram(
            "distributed_onnx_batch_requests", description="Requests per model call.", boundaries=_BATCH
        )
        self._batch_windows: Any = Histogram(
            "distributed_onnx_batch_windows", description="Series (windows) per model call.", boundaries=_BATCH
        )

    def request(self, endpoint: str, code: int, latency_ms: float) -> None:
        tags = {"endpoint": endpoint, "code": str(code)}
        self._requests.inc(1, tags=tags)
        if code >= 400:
            self._errors.inc(1, tags=tags)
        self._latency.observe(latency_ms, tags={"endpoint": endpoint})

    def batch(self, queue_ms: list[float], compute_ms: float, windows: int) -> None:
        for wait in queue_ms:
            self._queue.observe(wait)
        self._compute.observe(compute_ms, tags={"endpoint": "forecast"})
        self._batch_requests.observe(len(queue_ms))
        self._batch_windows.observe(windows)

    def compute(self, endpoint: str, compute_ms: float) -> None:
        self._compute.observe(compute_ms, tags={"endpoint": endpoint})
