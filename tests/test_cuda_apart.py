"""The CUDA path (``model/backend/cuda/``: batch buckets, CUDA-graph capture and replay, pinned transfers) has
never run on a GPU (``benchmarks/results/gpu.json``: ``"measured": false``; docs/gpu.md says so), so nothing on
the CPU path may depend on it: the backend imports it only when a provider chain asks for a GPU.

Shown twice: statically (no module outside ``model/backend/`` names it, and ``onnx.py`` only inside functions)
and by running the CPU path in a fresh interpreter (the entry points, the actor's part run, the server's app, a
real ONNX Runtime session on the bundled checkpoint) and finding no module of the CUDA path loaded.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "distributed_onnx"
CUDA = "distributed_onnx.model.backend.cuda"


def _module_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports at import time (its top-level statements, ``if TYPE_CHECKING`` left out)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_backend_names_the_cuda_path_and_never_at_import() -> None:
    importers = {}
    for path in PACKAGE.rglob("*.py"):
        if CUDA.replace(".", "/") in path.as_posix():
            continue
        text = path.read_text()
        if CUDA in text.replace("/", ".") and "import" in text:
            importers[path.relative_to(PACKAGE).as_posix()] = sorted(
                name for name in _module_level_imports(path) if name.startswith(CUDA)
            )
    assert set(importers) <= {"model/backend/onnx.py"}, importers
    assert importers.get("model/backend/onnx.py", []) == []  # lazily, where a GPU session needs it


CPU_PATH = f"""
import json, sys
import numpy as np
import distributed_onnx.api, distributed_onnx.cli, distributed_onnx.model.worker
import distributed_onnx.evaluation.actor.part, distributed_onnx.runtime.actors, distributed_onnx.serve.app
from distributed_onnx import LocalCheckpoint, OnnxBackend
from distributed_onnx.model.adapters.chronos2 import Chronos2Adapter
from distributed_onnx.resources import REFERENCE_CHECKPOINT

checkpoint = LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve()
inputs, rows = Chronos2Adapter(checkpoint.metadata).build_inputs(np.ones((2, 512), np.float32), None)
with OnnxBackend.from_checkpoint(checkpoint) as backend:
    shape = backend.run(inputs)["quantile_preds"].shape
print(json.dumps({{"shape": shape, "cuda": sorted(m for m in sys.modules if m.startswith("{CUDA}"))}}))
"""


@pytest.mark.integration
def test_the_cpu_path_runs_without_loading_the_cuda_path() -> None:
    done = subprocess.run([sys.executable, "-c", CPU_PATH], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"shape": [2, 9, 96], "cuda": []}


def test_the_unmeasured_label_matches_the_gpu_results() -> None:
    """While ``gpu.json`` says the CUDA path was not measured, its docs say "Unmeasured"; once it is, they must not."""
    root = PACKAGE.parent
    measured = json.loads((root / "benchmarks" / "results" / "gpu.json").read_text())["measured"]
    labelled = {
        "docs/gpu.md": "Unmeasured" in (root / "docs" / "gpu.md").read_text(),
        "docs/design.md": "unmeasured: never run on a GPU" in (root / "docs" / "design.md").read_text(),
        "cuda/__init__.py": "**Unmeasured**" in (PACKAGE / "model" / "backend" / "cuda" / "__init__.py").read_text(),
    }
    assert labelled == dict.fromkeys(labelled, not measured)
