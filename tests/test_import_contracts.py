"""The import contracts hold the package's boundaries: a deliberate bad import across each one breaks `lint-imports`.

`make lint-imports` (run by `.ci/run`) checks the tree as it is, so it shows only that the contracts are kept. This
test shows they can fail: it copies the package beside the project's own `pyproject.toml`, adds one import that
crosses each boundary, and runs the real `lint-imports` on the copy, which must name every contract broken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: A module on one side of a boundary -> the import that crosses it -> the contract that must break.
BAD_IMPORTS = [
    ("evaluation/actor/part_history.py", "import distributed_onnx.evaluation.driver.merge", "backtest-sides"),
    ("evaluation/scoring/registry.py", "import distributed_onnx.evaluation.actor.part", "backtest-shared"),
    ("serve/operations/health.py", "import distributed_onnx.evaluation.outputs", "serve-apart"),
    ("live/log/layout.py", "import distributed_onnx.live.score.join", "layers"),
    ("serve/wire/protocol.py", "import distributed_onnx.serve.log.traffic", "serve-roles"),
    ("serve/log/infer_windows.py", "import ray", "serve-wire-ray-free"),
    ("live/score/join.py", "import distributed_onnx.evaluation.dataset._scan", "stages-private"),
    ("evaluation/dataset/_groups.py", "import distributed_onnx.evaluation.planning", "stages"),
]


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is a dev dependency")
def test_a_bad_import_across_each_boundary_breaks_its_contract(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "distributed_onnx", tmp_path / "distributed_onnx", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line, _ in BAD_IMPORTS:
        path = tmp_path / "distributed_onnx" / module
        path.write_text(path.read_text() + f"\n{line}  # noqa\n")

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    names = _contract_names()
    for _, line, contract in BAD_IMPORTS:
        assert f"{names[contract]} BROKEN" in " ".join(report.split()), (contract, report)
        assert line.split()[1] in report, (line, report)


def _contract_names() -> dict[str, str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {contract["id"]: contract["name"] for contract in config["tool"]["importlinter"]["contracts"]}
