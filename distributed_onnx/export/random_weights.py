"""``export FAMILY --random-weights --size tiny|published``: a model to try with no download, forecasts meaningless.

Each family is built from its upstream package's own classes (as a pretrained folder is loaded) with seeded
random weights, written as the package writes a pretrained folder (``save_pretrained``'s ``config.json`` +
``model.safetensors``; TiRex's Lightning ``model.ckpt``; TimesFM's ``save_pretrained`` plus our
``forecast_config.json``), and then exported by the family's exporter exactly as a downloaded folder is: one
export path. The checkpoint's metadata says its forecasts are meaningless
(:data:`~distributed_onnx.export.metadata.MEANINGLESS`).

Sizes:

- ``tiny``: the small configs the tests build (seconds to export): for trying the pipeline end to end.
- ``published``: the published architectures with random weights, for benchmarks (a real model's cost):
  Chronos-2 as ``amazon/chronos-2``'s ``config.json`` (d_model 768, 12 layers of 12 heads, context 8192, patches
  of 16, at most 64 output patches, 21 quantiles; 119.5 M parameters), Chronos-Bolt as
  ``amazon/chronos-bolt-small`` (d_model 512, 6 + 6 layers of 8 heads, context 2048, 64 steps, patches of 16),
  TiRex as ``NX-AI/TiRex`` (12 sLSTM blocks of 512 with 4 heads, patches of 32, context 2048; 35.3 M parameters),
  Moirai 2 as ``Salesforce/moirai-2.0-R-small``'s ``config.json`` (d_model 384, d_ff 1024, 6 layers, patches of
  16, max_seq_len 512, 4 patches per call, 9 quantiles; 11.4 M parameters),
  Toto as ``Datadog/Toto-Open-Base-1.0``'s ``config.json`` (12 layers of 768 with 12 heads, MLP 3072, patches of
  64, 24 Student-t components, the causal patch scaler; 151.3 M parameters),
  and TimesFM 2.5 as ``google/timesfm-2.5-200m-pytorch`` (``TimesFM_2p5_200M_Definition``: 20 layers of 1280 with 16
  heads, patches of 32 in and 128 out, a quantile head of 1024 steps; 231.3 M parameters; exported at context 1024).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from distributed_onnx.errors import ConfigError
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.model.families import Family, load_object

Size = Literal["tiny", "published"]
SEED = 0
LEVELS_9 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
LEVELS_13 = [0.01, 0.05, *LEVELS_9, 0.95, 0.99]
LEVELS_21 = [0.01, 0.05, *[round(0.05 * i, 2) for i in range(2, 19)], 0.95, 0.99]

#: Chronos-2: the core config's sizes and its ``chronos_config``.
CHRONOS2: dict[str, dict[str, Any]] = {
    "tiny": {
        "sizes": {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4},
        "chronos_config": {"context_length": 64, "patch": 16, "max_output_patches": 5, "quantiles": LEVELS_13},
    },
    "published": {
        "sizes": {"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
        "chronos_config": {"context_length": 8192, "patch": 16, "max_output_patches": 64, "quantiles": LEVELS_21},
    },
}
#: Chronos-Bolt: the T5 sizes and its ``chronos_config``.
CHRONOS_BOLT: dict[str, dict[str, Any]] = {
    "tiny": {
        "sizes": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2, "d_kv": 16},
        "chronos_config": {"context_length": 64, "prediction_length": 16, "patch": 8},
    },
    "published": {
        "sizes": {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8, "d_kv": 64},
        "chronos_config": {"context_length": 2048, "prediction_length": 64, "patch": 16},
    },
}
#: TiRex: the Lightning checkpoint's ``hyper_parameters`` and the spread of the random weights (upstream leaves
#: its cells' parameters uninitialised, so every parameter is drawn).
TIREX: dict[str, dict[str, Any]] = {
    "tiny": {
        "hyper_parameters": {
            "model_config": {
                "input_patch_size": 8,
                "output_patch_size": 8,
                "quantiles": LEVELS_9,
                "block_kwargs": {"embedding_dim": 16, "num_heads": 2, "num_blocks": 1, "ffn_proj_factor": 2.0},
                "input_ff_dim": 32,
            },
            "train_ctx_len": 32,
        },
        "std": 0.2,
    },
    "published": {
        "hyper_parameters": {
            "model_config": {
                "input_patch_size": 32,
                "output_patch_size": 32,
                "quantiles": LEVELS_9,
                "block_kwargs": {"embedding_dim": 512, "num_heads": 4, "num_blocks": 12, "ffn_proj_factor": 2.6667},
                "input_ff_dim": 2048,
            },
            "train_ctx_len": 2048,
        },
        "std": 0.02,
    },
}

#: Moirai 2: ``Moirai2Module``'s arguments, as its ``config.json`` holds them (published: the hub's file).
MOIRAI2: dict[str, dict[str, Any]] = {
    "tiny": {
        "d_model": 64,  # one head: uni2ts gives d_model // 64 heads
        "d_ff": 128,
        "num_layers": 1,
        "patch_size": 8,
        "max_seq_len": 16,  # half the context (64 steps), half the horizon: up to 8 patches
        "attn_dropout_p": 0.0,
        "dropout_p": 0.0,
        "scaling": True,
        "num_predict_token": 2,
        "quantile_levels": LEVELS_9,
    },
    "published": {
        "d_model": 384,
        "d_ff": 1024,
        "num_layers": 6,
        "patch_size": 16,
        "max_seq_len": 512,
        "attn_dropout_p": 0.0,
        "dropout_p": 0.0,
        "scaling": True,
        "num_predict_token": 4,
        "quantile_levels": LEVELS_9,
    },
}

#: Toto: ``Toto``'s constructor arguments, as its ``config.json`` holds them.
TOTO: dict[str, dict[str, Any]] = {
    "tiny": {
        "patch_size": 8,
        "stride": 8,
        "embed_dim": 32,
        "num_layers": 2,
        "num_heads": 2,
        "mlp_hidden_dim": 64,
        "dropout": 0.0,
        "spacewise_every_n_layers": 2,
        "spacewise_first": True,
        "scaler_cls": "<class 'model.scaler.CausalPatchStdMeanScaler'>",
        "output_distribution_classes": ["<class 'model.distribution.MixtureOfStudentTsOutput'>"],
        "output_distribution_kwargs": {"k_components": 3},
        "use_memory_efficient_attention": False,
        "stabilize_with_global": True,
        "scale_factor_exponent": 10.0,
    },
    "published": {
        "patch_size": 64,
        "stride": 64,
        "embed_dim": 768,
        "num_layers": 12,
        "num_heads": 12,
        "mlp_hidden_dim": 3072,
        "dropout": 0.1,
        "spacewise_every_n_layers": 12,
        "spacewise_first": True,
        "scaler_cls": "<class 'model.scaler.CausalPatchStdMeanScaler'>",
        "output_distribution_classes": ["<class 'model.distribution.MixtureOfStudentTsOutput'>"],
        "output_distribution_kwargs": {"k_components": 24},
        "use_memory_efficient_attention": True,
        "stabilize_with_global": True,
        "scale_factor_exponent": 10.0,
    },
}


def write_random_pretrained(family: Family, size: Size, directory: Path, seed: int = SEED) -> Path:
    """``family`` at ``size`` with weights drawn from ``seed``, written to ``directory`` as a pretrained folder, by
    the writer its record names (``random_weights``; each is a function of this module for the built-in ones)."""
    if family.random_weights is None:
        raise ConfigError(
            f"Cannot build family {family.name!r} with random weights (its record names no writer); give "
            "--from-pretrained a downloaded folder."
        )
    writer = load_object(family.random_weights, family)
    folder: Path = writer(directory, size, seed)
    return folder


def write_chronos2(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``Chronos2Model`` saved by ``Chronos2Pipeline.save_pretrained``."""
    torch = require_torch()
    from chronos.chronos2 import Chronos2Model
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.pipeline import Chronos2Pipeline

    chosen = CHRONOS2[size]
    chronos = chosen["chronos_config"]
    torch.manual_seed(seed)
    config = Chronos2CoreConfig(
        **chosen["sizes"],
        chronos_config={
            "context_length": chronos["context_length"],
            "input_patch_size": chronos["patch"],
            "input_patch_stride": chronos["patch"],
            "output_patch_size": chronos["patch"],
            "max_output_patches": chronos["max_output_patches"],
            "quantiles": chronos["quantiles"],
            "use_reg_token": True,
            "use_arcsinh": True,
            "time_encoding_scale": chronos["context_length"],
        },
    )
    Chronos2Pipeline(Chronos2Model(config).eval()).save_pretrained(directory)
    return directory


def write_chronos_bolt(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``ChronosBoltModelForForecasting`` (a T5 encoder-decoder) saved by ``save_pretrained``."""
    torch = require_torch()
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    chosen = CHRONOS_BOLT[size]
    chronos = chosen["chronos_config"]
    torch.manual_seed(seed)
    # T5Config takes these as its **kwargs (config attributes chronos reads), which its stubs do not declare.
    settings: dict[str, Any] = {
        **chosen["sizes"],
        "dense_act_fn": "relu",
        "feed_forward_proj": "relu",
        "is_gated_act": False,
        "dropout_rate": 0.0,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "vocab_size": 2,
        "architectures": ["ChronosBoltModelForForecasting"],
        "chronos_pipeline_class": "ChronosBoltPipeline",
        "chronos_config": {
            "context_length": chronos["context_length"],
            "prediction_length": chronos["prediction_length"],
            "input_patch_size": chronos["patch"],
            "input_patch_stride": chronos["patch"],
            "quantiles": LEVELS_9,
            "use_reg_token": True,
        },
    }
    config = T5Config(**settings)
    ChronosBoltModelForForecasting(config).eval().save_pretrained(directory)
    return directory


def write_tirex(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``TiRexZero`` saved as the hub's ``model.ckpt`` (``hyper_parameters`` + ``state_dict``)."""
    torch = require_torch()
    from tirex.models.tirex import TiRexZero

    chosen = TIREX[size]
    torch.manual_seed(seed)
    model = TiRexZero(backend="torch", **chosen["hyper_parameters"])
    for parameter in model.parameters():  # upstream leaves its cell's parameters uninitialised (torch.empty)
        torch.nn.init.normal_(parameter, std=chosen["std"])
    directory.mkdir(parents=True, exist_ok=True)
    state = {"hyper_parameters": chosen["hyper_parameters"], "state_dict": model.state_dict()}
    torch.save(state, directory / "model.ckpt")
    return directory


def write_moirai2(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``Moirai2Module`` saved by its ``save_pretrained`` (``config.json`` + ``model.safetensors``)."""
    torch = require_torch()
    try:
        from uni2ts.model.moirai2 import Moirai2Module
    except ImportError as exc:
        from distributed_onnx.export.moirai2 import missing_uni2ts

        raise missing_uni2ts(exc) from exc

    torch.manual_seed(seed)
    Moirai2Module(**MOIRAI2[size]).eval().save_pretrained(directory)
    return directory


def write_toto(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``Toto`` saved as the hub's folder: ``config.json`` (its constructor arguments) + ``model.safetensors``."""
    import json

    torch = require_torch()
    try:
        from safetensors.torch import save_file
        from toto.model.toto import Toto
    except ImportError as exc:
        from distributed_onnx.export.toto import missing_toto

        raise missing_toto(exc) from exc

    config = dict(TOTO[size])
    torch.manual_seed(seed)
    model = Toto(**{**config, "use_memory_efficient_attention": False})  # xFormers' kernels: CUDA only
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: value.contiguous() for name, value in model.state_dict().items() if "rotary_emb" not in name}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory


#: TimesFM 2.5: ``TimesFM_2p5_200M_Definition``'s sizes (the class attribute the module builds from), the
#: ``forecast_config.json`` written beside the weights (the export's context) and the spread of the random
#: weights (upstream initialises its norms' scales to zero, which would cut every layer off: all are drawn).
TIMESFM: dict[str, dict[str, Any]] = {
    "tiny": {
        "sizes": {
            "input_patch_len": 8,
            "output_patch_len": 16,
            "output_quantile_len": 64,
            "model_dims": 32,
            "num_heads": 2,
            "num_layers": 2,
        },
        "forecast_config": {"max_context": 64},
        "std": 0.2,
    },
    "published": {
        "sizes": {
            "input_patch_len": 32,
            "output_patch_len": 128,
            "output_quantile_len": 1024,
            "model_dims": 1280,
            "num_heads": 16,
            "num_layers": 20,
        },
        "forecast_config": {"max_context": 1024},
        "std": 0.02,
    },
}


def write_timesfm(directory: Path, size: Size, seed: int = SEED) -> Path:
    """``TimesFM_2p5_200M_torch`` (its module built from a ``TimesFM_2p5_200M_Definition`` of ``size`` set as the
    class attribute it reads) saved by its own ``save_pretrained`` (``model.safetensors``), plus the forecast
    config."""
    import dataclasses
    import json

    torch = require_torch()
    from timesfm import configs
    from timesfm.timesfm_2p5 import timesfm_2p5_torch
    from timesfm.timesfm_2p5.timesfm_2p5_base import TimesFM_2p5_200M_Definition

    from distributed_onnx.export.torch_patches import patched

    chosen = TIMESFM[size]
    sizes = chosen["sizes"]
    dims, q = sizes["model_dims"], 10
    published = TimesFM_2p5_200M_Definition()

    def block(base: Any, input_dims: int, output_dims: int) -> Any:
        return dataclasses.replace(base, input_dims=input_dims, hidden_dims=dims, output_dims=output_dims)

    transformer = dataclasses.replace(
        published.stacked_transformers.transformer, model_dims=dims, hidden_dims=dims, num_heads=sizes["num_heads"]
    )
    definition = TimesFM_2p5_200M_Definition(
        input_patch_len=sizes["input_patch_len"],
        output_patch_len=sizes["output_patch_len"],
        output_quantile_len=sizes["output_quantile_len"],
        tokenizer=block(published.tokenizer, 2 * sizes["input_patch_len"], dims),
        stacked_transformers=configs.StackedTransformersConfig(num_layers=sizes["num_layers"], transformer=transformer),
        output_projection_point=block(published.output_projection_point, dims, sizes["output_patch_len"] * q),
        output_projection_quantiles=block(
            published.output_projection_quantiles, dims, sizes["output_quantile_len"] * q
        ),
    )
    torch.manual_seed(seed)
    with patched(timesfm_2p5_torch.TimesFM_2p5_200M_torch_module, "config", definition):
        model = timesfm_2p5_torch.TimesFM_2p5_200M_torch(torch_compile=False)
    with torch.no_grad():
        for parameter in model.model.parameters():
            torch.nn.init.normal_(parameter, std=chosen["std"])
    model.save_pretrained(directory)
    (directory / "forecast_config.json").write_text(json.dumps(chosen["forecast_config"]) + "\n", encoding="utf-8")
    return directory
