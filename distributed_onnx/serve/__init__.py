"""Online serving: a Ray Serve deployment on the backtest's worker, speaking the Open Inference Protocol.

The folders are the roles: ``wire/`` (what goes over the wire, pure codecs: the v1 and KServe v2 schemas,
tensors, Triton's binary extension, HTTP plumbing, gRPC), ``operations/`` (running it: admission, readiness,
which ingress, Serve's sockets on loopback, ``GET /metrics``) and ``log/`` (what an answer or a failure leaves
behind: the forecast log's rows, the shadow models' forecasts, the failures table). At the root: ``settings``
(typed config; the replica count, fixed or autoscaled, in ``autoscaling``), ``core`` (a replica without Serve:
admission, threads, health, request planning, per model), ``infer_call`` (a KServe v2 infer request checked and
planned), ``repository`` (many checkpoints loaded on first use, Serve's multiplexed LRU per replica), ``app``
(the deployment: routes and gRPC methods delegating to the core) and ``runner`` (foreground start/stop).
Import contracts hold the roles apart (``serve-roles``, ``serve-wire-ray-free`` in ``pyproject.toml``).

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
