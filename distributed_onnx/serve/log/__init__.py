"""What an answer or a failure leaves behind: the forecast log's rows, the shadows' forecasts, the failures.

Written through :mod:`distributed_onnx.live.log` (the format ``score`` reads), off the request's path.
"""
