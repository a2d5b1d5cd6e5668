"""The model layer: a checkpoint, the backend that runs it, the family adapter and the worker around them.

Nothing here imports Ray: the backtest's actors and the Serve replicas wrap the same
:class:`~distributed_onnx.model.worker.InferenceWorker`. Only ``backend/onnx.py`` (and its CUDA path in
``backend/cuda/``) touches ONNX Runtime. See docs/design.md, "Layers".
"""
