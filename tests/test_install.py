"""What each entry point installs: the main job no torch and no CUDA, the tests torch's CPU build only.

Unit tier for the Makefile (``make -n -B`` prints every command a fresh clone would run) and the CUDA
classifier. The resolution against PyPI itself (network, ~20 s) is ``make check-install``, which ``.ci/run`` runs.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import tomllib
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


def _declared(extras: set[str]) -> list[dict[str, object]]:
    """The distributions ``pyproject.toml`` declares for the package with ``extras``, as pip-report entries."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [
        line for extra in sorted(extras) for line in project["optional-dependencies"][extra]
    ]
    return [_install(Requirement(line).name, "") for line in lines]


def _extras_installed_by(target: str) -> set[str]:
    """The extras of this package that ``make <target>`` installs (``-e ".[cpu,dev]"`` gives cpu and dev)."""
    extras: set[str] = set()
    for command in _install_commands(target):
        extras.update(part for match in re.findall(r'-e "\.\[([^\]]*)\]"', command) for part in match.split(","))
    return extras


def test_make_backtest_installs_no_torch_and_no_cuda() -> None:
    """What the main job's install declares holds no torch and no CUDA package (``make check-install`` proves
    the same of the full resolution against PyPI, with the network)."""
    extras = _extras_installed_by("backtest")
    assert "cpu" in extras, extras  # ONNX Runtime itself
    assert cuda_packages(_declared(extras)) == []
    # The check is live: the export extra (the reference model's training) would bring torch.
    assert cuda_packages(_declared(extras | {"export"})) == ["torch=="]


def test_make_test_installs_torch_from_the_cpu_build_before_the_extras() -> None:
    torch_line, extras_line, no_deps_line = _install_commands("test")
    if platform.system() == "Linux":
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in torch_line
        assert "+cpu" in torch_line
    assert "torch==" in torch_line
    (extras,) = re.findall(r'-e "\.\[([^\]]*)\]"$', extras_line)
    assert {"cpu", "dev", "export", "chronos"} <= set(extras.split(","))  # the upstream packages the tests compare
    # Moirai 2's uni2ts and Toto's toto-ts pin torch and numpy: installed after the extras, without their pins.
    assert "--no-deps" in no_deps_line, no_deps_line
    assert "uni2ts==" in no_deps_line and "toto-ts==" in no_deps_line, no_deps_line


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
