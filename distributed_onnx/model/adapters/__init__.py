"""Model-family adapters, looked up by the checkpoint's ``model_family`` in the family registry
(:mod:`distributed_onnx.model.families`, which names each family's adapter; nothing is registered here)."""

from distributed_onnx.model.adapters.base import AdapterFactory, ModelAdapter, adapter_for, register_adapter
from distributed_onnx.model.adapters.chronos2 import Chronos2Adapter, Chronos2Variant, detect_variant
from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter
from distributed_onnx.model.families import PLUGIN_GROUP

__all__ = [
    "PLUGIN_GROUP",
    "AdapterFactory",
    "Chronos2Adapter",
    "Chronos2Variant",
    "ContextQuantilesAdapter",
    "ModelAdapter",
    "adapter_for",
    "detect_variant",
    "register_adapter",
]
