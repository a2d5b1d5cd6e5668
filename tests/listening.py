"""Which TCP addresses a process tree listens on: the package's own reader (``runtime/listening.py``)."""

from distributed_onnx.runtime.listening import is_loopback, listening_addresses, process_tree

__all__ = ["is_loopback", "listening_addresses", "process_tree"]
