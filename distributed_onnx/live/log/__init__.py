"""The forecast log: every forecast the service answered (and every shadow forecast), kept to be scored later.

Written by the serving side (:mod:`.writer`, off the request path), read by ``distributed-onnx score``
(:mod:`distributed_onnx.live.score`); the format both agree on is :mod:`.layout`. This package sits
beside ``runtime/`` in the layers: ``serve`` and ``evaluation`` may import it, it imports only ``model`` (for
the quantile column names) and the foundation (:mod:`distributed_onnx.storage`), never Ray.
"""
