"""Online serving: a Ray Serve deployment on the backtest's worker, speaking the Open Inference Protocol.

``settings`` (typed config), ``schemas`` (wire models), ``protocol`` and ``forecasting`` (pure codecs),
``http`` (FastAPI plumbing and error mapping), ``admission`` (requests counted and their memory charged),
``core`` (a replica without Serve: admission, threads, health, request planning, per model), ``app`` (the
deployment: routes and gRPC methods delegating to the core), ``runner`` (foreground start/stop),
``ingress`` (which of Serve's ingresses), ``loopback`` (Serve's sockets on loopback, checked at start).
This package never imports :mod:`distributed_onnx.evaluation` (lint-imports checks it); both build on
:mod:`distributed_onnx.model.worker`.
"""

from distributed_onnx.serve.settings import ServeSettings

__all__ = ["ServeSettings"]
