"""The runtime on Ray: the embedded local Ray, the actors that own workers, and the dispatcher of parts.

With :mod:`distributed_onnx.serve`, the only package that imports Ray; the evaluation layer reaches Ray
through :mod:`distributed_onnx.runtime.cluster`. See docs/design.md, "Layers".
"""
