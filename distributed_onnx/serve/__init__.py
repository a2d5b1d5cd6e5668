"""Online serving: a Ray Serve deployment on the backtest's worker, speaking the Open Inference Protocol.

``settings`` (typed config; the replica count, fixed or autoscaled, in ``autoscaling``), ``schemas`` (wire
models), ``protocol`` and ``forecasting`` (pure codecs),
``http`` (FastAPI plumbing and error mapping), ``admission`` (requests counted and their memory charged),
``core`` (a replica without Serve: admission, threads, health, request planning, per model), ``app`` (the
deployment: routes and gRPC methods delegating to the core), ``runner`` (foreground start/stop),
``ingress`` (which of Serve's ingresses), ``loopback`` (Serve's sockets on loopback, checked at start),
``infer_call`` (a KServe v2 infer request checked and planned), ``live_log`` and ``infer_log`` (what an answer
leaves behind: the forecast log's rows and the shadow models' forecasts, for /v1 and v2 alike), ``live_metrics``
(``GET /metrics``), ``repository`` (many checkpoints loaded on first use, Serve's multiplexed LRU per replica).

Several models live in every replica of one deployment rather than in Ray Serve's model multiplexing or in one
deployment per model: measured side by side (``benchmarks/results/multiplex.md``), multiplexing matched its
throughput only while every model stayed loaded and paid a model load on first use and on every switch beyond
its LRU, and a deployment per model cost a replica's memory per model plus, behind one ``/v1/forecast`` entry, a
handle call per request (the slowest way measured); shadows need their models warm on every request (details in
:mod:`distributed_onnx.serve.app`).
This package never imports :mod:`distributed_onnx.evaluation` (lint-imports checks it); both build on
:mod:`distributed_onnx.model.worker`.
"""

from distributed_onnx.serve.settings import ServeSettings

__all__ = ["ServeSettings"]
