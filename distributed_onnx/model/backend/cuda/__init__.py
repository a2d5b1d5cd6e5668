"""The CUDA data path of the ONNX backend: batch buckets, CUDA graph capture and replay, host/device copies."""
