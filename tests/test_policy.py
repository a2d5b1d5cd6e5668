"""Provider policy and the strict/graceful fallback contract, with fake hosts (unit tier)."""

from __future__ import annotations

import logging

import pytest
from graphs import tiny_chronos2_metadata
from pydantic import TypeAdapter

from distributed_onnx.errors import ProviderNotAllowedError, ProviderUnavailableError
from distributed_onnx.model.backend.cuda.buckets import BucketPlan
from distributed_onnx.model.backend.policy import (
    DefaultProviderPolicy,
    HostCapabilities,
    check_allowed,
    check_realized,
)
from distributed_onnx.model.backend.providers import (
    CoreMLProvider,
    CpuProvider,
    CudaProvider,
    ProviderChain,
    TensorRTProvider,
    provider_from_kind,
)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
COREML = "CoreMLExecutionProvider"


def host(*providers: str, platform: str = "linux", gpu_assigned: bool = True) -> HostCapabilities:
    return HostCapabilities(platform=platform, available_providers=frozenset(providers), gpu_assigned=gpu_assigned)


def kinds(chain: list[object]) -> list[str]:
    return [p.kind for p in chain]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("facts", "metadata_changes", "expected"),
    [
        (host(CPU), {}, ["cpu"]),
        (host(CUDA, CPU), {}, ["cuda", "cpu"]),
        (host(CUDA, CPU, gpu_assigned=False), {}, ["cpu"]),  # a Ray actor without num_gpus
        (host(CUDA, CPU), {"precision": "int8"}, ["cuda", "cpu"]),
        (host(COREML, CPU, platform="darwin"), {"static_shapes": True}, ["coreml", "cpu"]),
        (host(COREML, CPU, platform="darwin"), {"static_shapes": False}, ["cpu"]),
        (host(COREML, CPU, platform="darwin"), {"static_shapes": True, "precision": "int8"}, ["cpu"]),
    ],
)
def test_default_policy(facts: HostCapabilities, metadata_changes: dict[str, object], expected: list[str]) -> None:
    chain = DefaultProviderPolicy().select(tiny_chronos2_metadata(**metadata_changes), facts)
    assert kinds(chain) == expected


def test_policy_never_selects_tensorrt() -> None:
    chain = DefaultProviderPolicy().select(tiny_chronos2_metadata(), host("TensorrtExecutionProvider", CUDA, CPU))
    assert "tensorrt" not in kinds(chain)


def test_gpu_chain_refused_without_gpu() -> None:
    with pytest.raises(ProviderNotAllowedError, match=r"\['cuda'\] need a GPU"):
        check_allowed([CudaProvider(), CpuProvider()], host(CUDA, CPU, gpu_assigned=False))
    check_allowed([CpuProvider()], host(CUDA, CPU, gpu_assigned=False))


def test_strict_chain_raises_when_accelerator_missing() -> None:
    with pytest.raises(ProviderUnavailableError, match="CUDAExecutionProvider"):
        check_realized([CudaProvider(), CpuProvider()], [CPU], strict=True)


def test_graceful_chain_warns_only_on_full_fallback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_realized([TensorRTProvider(), CudaProvider(), CpuProvider()], [CUDA, CPU], strict=False)
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        check_realized([CudaProvider(), CpuProvider()], [CPU], strict=False)
    assert "fell back" in caplog.text


def test_providers_compile_to_ort() -> None:
    assert CudaProvider(device_id=1, gpu_mem_limit_bytes=1 << 30).to_ort() == (
        CUDA,
        {
            "device_id": "1",
            "cudnn_conv_algo_search": "HEURISTIC",
            "use_tf32": "1",
            "gpu_mem_limit": str(1 << 30),
            "enable_cuda_graph": "1",
        },
    )
    assert CudaProvider(cuda_graph=False, use_tf32=False).to_ort() == (
        CUDA,
        {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0"},
    )
    name, options = TensorRTProvider(engine_cache_dir="/c", timing_cache_dir="/t").to_ort()  # type: ignore[arg-type]
    assert name == "TensorrtExecutionProvider"
    assert options["trt_engine_cache_path"] == "/c"
    assert options["trt_timing_cache_path"] == "/t"
    assert options["trt_fp16_enable"] == "True"
    assert CoreMLProvider().to_ort() == (COREML, {"ModelFormat": "MLProgram", "MLComputeUnits": "CPUAndGPU"})


def test_provider_from_kind_and_unknown() -> None:
    assert provider_from_kind("CUDA") == CudaProvider()
    with pytest.raises(ValueError, match="Unknown execution provider 'tpu'"):
        provider_from_kind("tpu")


def test_cuda_as_users_name_it_keeps_orts_tf32_captures_graphs_and_pads_at_most_double() -> None:
    """``--providers cuda`` (or ``cuda`` in YAML): what ORT is handed, and what padding a batch pays."""
    (cuda,) = TypeAdapter(ProviderChain).validate_python("cuda")
    name, options = cuda.to_ort()
    assert name == CUDA
    assert options["use_tf32"] == "1"  # ORT's own default: GPU forecasts stay as fast as ORT makes them
    assert options["enable_cuda_graph"] == "1"
    plan = BucketPlan(cuda.batch_buckets)
    assert plan.select(1) == plan.buckets[0] and plan.select(plan.largest + 1) is None
    for rows in range(plan.buckets[0], plan.largest + 1):
        bucket = plan.select(rows)
        assert bucket is not None and rows <= bucket < 2 * rows, (rows, bucket)


def test_batch_buckets_are_sorted_positive_row_counts() -> None:
    assert CudaProvider(batch_buckets=[1024, 64, 64, 256]).batch_buckets == (64, 256, 1024)  # type: ignore[arg-type]
    for bad in ([], [0, 64], [-4]):
        with pytest.raises(ValueError, match="batch_buckets"):
            CudaProvider(batch_buckets=bad)  # type: ignore[arg-type]


def test_cuda_graph_settings_round_trip_through_a_provider_chain() -> None:
    from pydantic import TypeAdapter

    from distributed_onnx.model.backend.providers import ProviderChain

    chain = TypeAdapter(ProviderChain).validate_python(
        [{"kind": "cuda", "cuda_graph": False, "batch_buckets": [256, 1024]}, "cpu"]
    )
    assert chain == [CudaProvider(cuda_graph=False, batch_buckets=(256, 1024)), CpuProvider()]
    assert TypeAdapter(ProviderChain).validate_python("cuda,cpu") == [CudaProvider(), CpuProvider()]
