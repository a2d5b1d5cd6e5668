"""The runtime on Ray: the embedded local Ray, the actors that own workers, and the dispatcher of parts.

With :mod:`distributed_onnx.serve`, the only package that imports Ray; the evaluation layer reaches Ray
through :mod:`distributed_onnx.runtime.cluster`. Every private or experimental part of Ray the package uses is
named in :mod:`distributed_onnx.runtime.ray_private`; :mod:`distributed_onnx.runtime.listening` reads which
addresses a process tree listens on. See docs/design.md, "Layers".
"""
