"""The CUDA data path of the ONNX backend: batch buckets, CUDA graph capture and replay, host/device copies.

**Unmeasured**: this path has never run on a GPU (``benchmarks/results/gpu.json``: ``"measured": false``; its
tests are ``tests/test_gpu.py``, skipped without CUDA, and the pure parts' CPU tests). The backend imports it only
when a provider chain asks for a GPU, so nothing on the CPU path depends on it (``tests/test_cuda_apart.py``).
"""
