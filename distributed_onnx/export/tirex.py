"""``distributed-onnx export tirex``: a TiRex checkpoint -> an ONNX graph with TiRex's official contract.

The pretrained folder holds ``model.ckpt`` as the model hub has it (a Lightning checkpoint: its
``hyper_parameters`` build ``TiRexZero``, its ``state_dict`` fills it); it is loaded with the package's own
``TiRexZero.from_pretrained`` and its torch backend (``backend="torch"``, CPU: the optional ``xlstm`` CUDA
kernels are neither needed nor used). The graph is one call of ``TiRexZero._forecast_single_step``:
``context`` f32 ``[rows, train_ctx_len]`` (NaN = missing) -> ``quantiles`` ``[rows, output_patch_size steps,
quantiles]``, the contract of NX-AI's published ``tirex.onnx``. Longer horizons append the steps as NaN and call
again, as ``TiRexZero._forecast_tensor`` does (``long_horizon: append_missing``, done by this package's worker).

Export-only changes (:func:`_exportable`), each computing upstream's values from ops that export:

- ``StandardScaler.get_loc_scale`` without ``torch.nanmean``.
- The sLSTM cell's torch path (``sLSTMCell._impl_torch``) rounds its input, recurrent kernel, states and
  recurrent matmul to bfloat16. ONNX Runtime has no bfloat16 MatMul on CPU, so the graph keeps float32 and
  rounds where upstream rounds (a cast to bfloat16 and back), the matmul accumulating in float32. In torch,
  this replacement gives upstream's forecasts bit for bit; through ONNX Runtime what remains is the order of
  float32 sums, which the parity report measures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError, MissingExtraError
from distributed_onnx.export.context_model import export_context_model
from distributed_onnx.export.graph import context_module
from distributed_onnx.export.metadata import resolution_of
from distributed_onnx.export.pretrained import pretrained_folder
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.export.torch_patches import observed_mean, patched
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.families import rules_of

OUTPUT_NAME = "quantiles"
CHECKPOINT_FILE = "model.ckpt"


def checkpoint_file(pretrained: Path) -> Path:
    """``DIR/model.ckpt`` (or the file itself when given one)."""
    path = pretrained if pretrained.is_file() else pretrained / CHECKPOINT_FILE
    if not path.is_file():
        raise ConfigError(
            f"--from-pretrained {pretrained} holds no {CHECKPOINT_FILE}: give the folder with TiRex's "
            f"{CHECKPOINT_FILE} as downloaded from the model hub (NX-AI/TiRex).",
            key="from_pretrained",
        )
    return path


def load_model(request: ExportRequest) -> Any:
    """``TiRexZero`` from the local checkpoint, torch backend, CPU, in eval mode."""
    try:
        from tirex.models.tirex import TiRexZero
    except ImportError as exc:
        raise MissingExtraError.for_package("tirex", "tirex", exc) from exc
    model = TiRexZero.from_pretrained(str(checkpoint_file(request.folder)), backend="torch", device="cpu")
    return model.eval()


def metadata_for(model: Any, resolution_minutes: int) -> CheckpointMetadata:
    config = model.config
    return CheckpointMetadata(
        model_family="tirex",
        input_names=["context"],
        output_name=OUTPUT_NAME,
        native_quantiles=list(config.quantiles),
        context_length=config.train_ctx_len,
        output_patch_size=config.output_patch_size,
        horizon_patches=1,
        resolution_minutes=resolution_minutes,
        **rules_of("tirex").metadata_fields(),  # the family's rules, declared once (model/families.py)
        description=(
            f"TiRex exported by distributed-onnx ({config.block_kwargs.get('num_blocks')} sLSTM blocks of "
            f"{config.block_kwargs.get('embedding_dim')}); built with technology from NXAI (NXAI Community License)"
        ),
    )


def export(request: ExportRequest) -> ExportResult:
    resolution = resolution_of(request)  # --data checked before the model loads
    with pretrained_folder(request, "TiRex"):
        model = load_model(request)
        metadata = metadata_for(model, resolution)
    torch = require_torch()

    def one_call(model: Any, context: Any) -> Any:
        """``context -> [rows, steps, quantiles]``: one patch of ``_forecast_single_step``, steps before levels."""
        return model._forecast_single_step(context.to(torch.float32), 1).transpose(1, 2)

    return export_context_model(
        request, metadata, context_module(model, one_call), _exportable(), _upstream_forecast(model)
    )


def _upstream_forecast(model: Any) -> Any:
    torch = require_torch()

    def forecast(context: np.ndarray, horizon: int) -> np.ndarray:
        quantiles, _ = model.forecast(torch.from_numpy(context), prediction_length=horizon)  # [W, H, Q]
        return np.asarray(quantiles.numpy())

    return forecast


@contextlib.contextmanager
def _exportable() -> Iterator[None]:
    """The scaler without ``nanmean`` and the sLSTM cell with bfloat16 rounding in float32; undone after."""
    torch = require_torch()
    from tirex.models.patcher import StandardScaler, StandardScalerState
    from tirex.models.slstm.cell import sLSTMCell, sLSTMCellTorch

    def get_loc_scale(self: Any, x: Any, eps: float = 1e-5) -> Any:  # upstream's lines, nanmean replaced
        loc = torch.nan_to_num(observed_mean(x), nan=0.0)
        scale = torch.nan_to_num(observed_mean((x - loc).square()).sqrt(), nan=1.0)
        scale = torch.where(scale == 0, torch.abs(loc) + eps, scale)
        return StandardScalerState(loc=loc, scale=scale)

    def bf16(value: Any) -> Any:
        return value.to(torch.bfloat16).to(torch.float32)

    def impl_torch(self: Any, input: Any, state: Any) -> Any:
        """``_impl_torch`` + ``slstm_forward``: the same steps, each bfloat16 rounding kept, in float32."""
        config = self.config
        x = bf16(input).view(input.shape[0], input.shape[1], -1)
        states = [bf16(each) for each in state.unbind(dim=0)]
        kernel = bf16(self._recurrent_kernel_)
        bias = self._bias_.to(torch.float32)
        bias = bias.reshape(config.num_heads, config.num_gates, config.head_dim).permute(1, 0, 2).reshape(-1)
        heads, batch = kernel.shape[0], x.shape[1]
        outputs = []
        for step in range(x.shape[0]):
            recurrent = states[0].reshape(batch, heads, 1, -1).matmul(kernel.unsqueeze(0))
            recurrent = bf16(recurrent.reshape(batch, heads, 4, -1).transpose(1, 2).reshape(batch, -1))
            states = [bf16(each) for each in sLSTMCellTorch.slstm_forward_pointwise(x[step], recurrent, bias, states)]
            outputs.append(states[0])
        return torch.stack(outputs), torch.stack(states)

    with patched(StandardScaler, "get_loc_scale", get_loc_scale), patched(sLSTMCell, "_impl_torch", impl_torch):
        yield
