"""What an answer leaves behind: the forecast log's rows and the shadows' forecasts.

Written through :mod:`distributed_onnx.live.log` (the format ``score`` reads), off the request's path. A failed
request's record has its one home there too (:mod:`distributed_onnx.live.log.failures`), described by the wire
(:mod:`distributed_onnx.serve.wire.failure_kinds`).
"""
