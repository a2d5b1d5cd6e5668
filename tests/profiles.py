"""What ONNX Runtime ran in one call of a checkpoint, from its own profiler: which products, at which shapes.

An exporter that leaves work out (a head on the one token a forecast reads, a decode step a call does not ask)
is checked by what ran, not by the graph's text: ORT's fusions rename and merge nodes, its profiler records
each kernel that ran with the shapes it ran on.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: The kernels of a matrix product, as ORT names them before and after its fusions.
PRODUCTS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm"})


def product_outputs(weights: Path, feeds: dict[str, np.ndarray], folder: Path) -> list[list[int]]:
    """The output shape of every matrix product ORT ran in one call of ``weights`` on ``feeds`` (its profile is
    written in ``folder``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / f"profile-{weights.stem}")
    session = ort.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    trace = json.loads(Path(session.end_profiling()).read_text())
    return [
        list(next(iter(event["args"]["output_type_shape"][0].values())))
        for event in trace
        if event.get("cat") == "Node" and event["args"].get("op_name") in PRODUCTS
    ]


def tokens_through(shapes: list[list[int]], width: int, rows: int) -> list[int]:
    """For each product whose output's last axis is ``width`` (a head's), the tokens per row it ran on."""
    return [int(np.prod(shape[:-1])) // rows for shape in shapes if shape and shape[-1] == width]
