"""Model-family adapters, looked up by the checkpoint's ``model_family``."""

from distributed_onnx.model.adapters.base import (
    PLUGIN_GROUP,
    AdapterFactory,
    ModelAdapter,
    adapter_for,
    register_adapter,
)
from distributed_onnx.model.adapters.chronos2 import Chronos2Adapter, Chronos2Variant, detect_variant
from distributed_onnx.model.adapters.chronos_bolt import ChronosBoltAdapter
from distributed_onnx.model.adapters.context_quantiles import ContextQuantilesAdapter
from distributed_onnx.model.adapters.timesfm import TimesFMAdapter
from distributed_onnx.model.adapters.tirex import TiRexAdapter

register_adapter("chronos2", Chronos2Adapter)
register_adapter("chronos_bolt", ChronosBoltAdapter)
register_adapter("context_quantiles", ContextQuantilesAdapter)
register_adapter("tirex", TiRexAdapter)
register_adapter("timesfm", TimesFMAdapter)

__all__ = [
    "PLUGIN_GROUP",
    "AdapterFactory",
    "Chronos2Adapter",
    "Chronos2Variant",
    "ChronosBoltAdapter",
    "ContextQuantilesAdapter",
    "ModelAdapter",
    "TiRexAdapter",
    "TimesFMAdapter",
    "adapter_for",
    "detect_variant",
    "register_adapter",
]
