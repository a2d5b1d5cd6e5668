"""``python -m distributed_onnx`` is the ``distributed-onnx`` command."""

from distributed_onnx.cli import run

run()
