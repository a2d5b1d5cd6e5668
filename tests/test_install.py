"""What each entry point installs: the main job no torch and no CUDA, the tests torch's CPU build only.

Unit tier for the Makefile (``make -n -B`` prints every command a fresh clone would run), the CUDA classifier and
the exporter installs docs/export.md documents. The resolution against PyPI itself (network, ~20 s) is ``make
check-install``, and each documented exporter install in a fresh venv (network, minutes) ``make
check-export-installs``; ``.ci/run`` runs both.
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

from check_export_installs import read_blocks, shared_part  # noqa: E402
from check_install import cuda_packages  # noqa: E402

from distributed_onnx.errors import MissingExtraError  # noqa: E402
from distributed_onnx.model import families  # noqa: E402


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


def _makefile_variable(name: str) -> str:
    (value,) = re.findall(rf"^{name} \?= (.*)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    return value.strip()


def test_every_exporter_has_a_documented_install_that_ci_checks() -> None:
    """docs/export.md's install blocks (what ``make check-export-installs`` installs and exports, one venv each)
    cover every family with an exporter, install ONNX Runtime and torch with the family's extra, pin the Makefile's
    torch and its --no-deps versions, and ``.ci/run`` runs the check."""
    blocks = read_blocks((REPO / "docs" / "export.md").read_text())
    exportable = {record.name for record in families.BUILT_IN if record.exporter is not None}
    assert sorted(family for block in blocks for family in block.families) == sorted(exportable)
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    no_deps = set(_makefile_variable("UPSTREAM_NO_DEPS").split())
    for block in blocks:
        assert {"cpu", "export"} < block.extras <= declared, (block.families, block.extras)
        assert block.commands[0][-1] == f"torch=={_makefile_variable('TORCH_VERSION')}+cpu", block.commands[0]
        for command in block.commands:
            if "--no-deps" in command:
                assert set(command) - {"--no-deps"} <= no_deps, (command, no_deps)
    # Installed once and shared (what every block installs anyway): torch's line and the package's common extras.
    assert shared_part(blocks) == (blocks[0].commands[0], ("-e", ".[cpu,export]"))
    assert "make check-export-installs" in (REPO / ".ci" / "run").read_text()
    assert "scripts/check_export_installs.py" in (REPO / "Makefile").read_text()


def test_a_package_missing_one_of_its_own_imports_is_not_called_not_installed() -> None:
    """uni2ts installed without toolz once read "uni2ts is not installed" (it was): the message says which module
    failed, and "not installed" only when the package itself is absent."""
    lacking = MissingExtraError.for_package(
        "chronos", "chronos", ModuleNotFoundError("No module named 'toolz'", name="toolz")
    )
    assert str(lacking).startswith("chronos is installed but cannot be imported (No module named 'toolz')"), lacking
    absent = MissingExtraError.for_package(
        "chronos", "chronos", ModuleNotFoundError("No module named 'chronos'", name="chronos")
    )
    assert str(absent).startswith("chronos is not installed."), absent
