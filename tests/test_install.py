"""What each entry point installs: the main job no torch and no CUDA, the tests torch's CPU build only.

Unit tier for the Makefile (``make -n -B`` prints every command a fresh clone would run) and the CUDA
classifier. The resolution against PyPI itself (network, ~20 s) is ``make check-install``, which ``.ci/run`` runs.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from check_install import cuda_packages  # noqa: E402


def _install_commands(target: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    printed = subprocess.run(
        ["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [line for line in printed if "pip install" in line and "--upgrade pip" not in line]


def test_make_backtest_installs_only_the_cpu_extra() -> None:
    assert _install_commands("backtest") == ['.venv/bin/python -m pip install --quiet -e ".[cpu]"']


def test_make_test_installs_torch_from_the_cpu_build_before_the_extras() -> None:
    torch_line, extras_line = _install_commands("test")
    if platform.system() == "Linux":
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_line
        assert "+cpu" in torch_line
    assert "torch==" in torch_line
    assert extras_line.endswith('-e ".[cpu,dev,export]"')


def _install(name: str, version: str) -> dict[str, object]:
    return {"metadata": {"name": name, "version": version}}


def test_cuda_classifier() -> None:
    report = [
        _install("numpy", "2.3.0"),
        _install("nvidia_cublas", "13.1.1"),
        _install("cuda-toolkit", "13.0.3"),
        _install("triton", "3.7.1"),
        _install("onnxruntime", "1.32.0"),
        _install("onnxruntime-gpu", "1.32.0"),
        _install("nvidia-cudnn-cu13", "9.20"),
    ]
    assert cuda_packages(report) == [
        "cuda-toolkit==13.0.3",
        "nvidia-cublas==13.1.1",
        "nvidia-cudnn-cu13==9.20",
        "onnxruntime-gpu==1.32.0",
        "triton==3.7.1",
    ]


def test_torch_counts_unless_allowed_and_a_cuda_build_always() -> None:
    assert cuda_packages([_install("torch", "2.13.0+cpu")]) == ["torch==2.13.0+cpu"]
    assert cuda_packages([_install("torch", "2.13.0+cpu")], allow_torch=True) == []
    assert cuda_packages([_install("torch", "2.13.0+cu128")], allow_torch=True) == ["torch==2.13.0+cu128"]
