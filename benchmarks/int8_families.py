"""Which families' graphs ONNX Runtime's int8 quantization applies to: each family's tiny random-weight export,
quantized in both modes, run, and compared with its parent.

For each family with an exporter (``distributed_onnx.model.families.BUILT_IN``): ``distributed-onnx export FAMILY
--random-weights --size tiny --data D --quantize int8 --quantize-mode dynamic`` (the export and its dynamic
variant, through the command's own code), then the static variant of the same parent
(``distributed_onnx.export.variants.write_int8_variant``, calibrated on D's windows). Recorded per family and mode:
whether it quantized and ran, the variant's parity against its parent (``NAME-int8.parity.json``: ``max_rel_diff``
against ``VARIANT_TOLERANCE``) and how many of the graph's MatMuls became integer ones. D is a seeded table of 16
half-hourly series with daily cycles, noise and gaps (the parity's windows: the last context of each). This is
what each family's record (``Int8``) declares; no timing is taken.

Reproduce (minutes: six exports)::

    .venv/bin/python benchmarks/int8_families.py --workdir /tmp/int8-families

Results go to ``benchmarks/results/int8_families.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

RESOLUTION_MINUTES = 30
SERIES, STEPS = 16, 400


def write_data(path: Path) -> Path:
    """Seeded half-hourly series: daily cycles at several levels, noise, scattered gaps and one run of them."""
    rng = np.random.default_rng(0)
    start = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
    step_us = RESOLUTION_MINUTES * 60_000_000
    ids, stamps, values = [], [], []
    for series in range(SERIES):
        steps = np.arange(STEPS)
        y = rng.uniform(20, 500) + rng.uniform(2, 40) * np.sin(2 * np.pi * steps / 48) + rng.normal(0, 2, STEPS)
        y[rng.random(STEPS) < 0.05] = np.nan
        if series == 0:
            y[200:230] = np.nan
        ids += [f"s{series}"] * STEPS
        stamps.append(start + steps * step_us)
        values.append(y)
    y_all = np.concatenate(values)
    table = pa.table(
        {
            "series_id": pa.array(ids, pa.string()),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(y_all, mask=np.isnan(y_all)),
        }
    )
    pq.write_table(table, path)
    return path


def matmuls(path: Path) -> dict[str, int]:
    """The graph's MatMul-like nodes by type, subgraphs included."""
    import onnx

    counts: Counter[str] = Counter()

    def walk(graph: Any) -> None:
        for node in graph.node:
            if "MatMul" in node.op_type or node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear"):
                counts[node.op_type] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g)

    walk(onnx.load(path, load_external_data=False).graph)
    return dict(sorted(counts.items()))


def one_family(family: str, workdir: Path, data: Path) -> dict[str, Any]:
    from distributed_onnx.export import run_export
    from distributed_onnx.export.request import ExportRequest
    from distributed_onnx.export.variants import write_int8_variant

    output = workdir / family / f"{family}.onnx"
    values = {
        "family": family,
        "random_weights": True,
        "size": "tiny",
        "output": output,
        "data": str(data),
        "parity_windows": SERIES,
        "quantize": "int8",
    }
    result: dict[str, Any] = {"parent_matmuls": None, "modes": {}}
    for mode in ("dynamic", "static"):
        request = ExportRequest.model_validate(values | {"quantize_mode": mode})
        try:
            if mode == "dynamic":
                exported = run_export(request)
                result["parity"] = exported.parity["max_rel_diff"]
                result["parent_matmuls"] = matmuls(output)
                variant, comparison = exported.variant_path, exported.variant
            else:
                variant, comparison = write_int8_variant(request)
        except Exception as exc:  # a mode that does not apply: recorded, not raised
            result["modes"][mode] = {"applies": False, "error": f"{type(exc).__name__}: {exc}"}
            continue
        assert variant is not None and comparison is not None
        kept = ("windows", "max_abs_diff", "max_rel_diff", "median_abs_diff", "tolerance", "passed")
        result["modes"][mode] = {
            "applies": bool(comparison["passed"]),
            **{key: comparison[key] for key in kept},
            "matmuls": matmuls(variant),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "int8_families.json")
    args = parser.parse_args()

    import onnxruntime

    from distributed_onnx.model.backend.cpu_features import detect_cpu
    from distributed_onnx.model.families import BUILT_IN

    args.workdir.mkdir(parents=True, exist_ok=True)
    data = write_data(args.workdir / "data.parquet")
    families = {family.name: one_family(family.name, args.workdir, data) for family in BUILT_IN if family.exporter}
    document = {
        "what": __doc__.splitlines()[0],
        "onnxruntime": onnxruntime.__version__,
        "machine": {"platform": platform.platform(), "cpu": detect_cpu()},
        "data": {"series": SERIES, "steps": STEPS, "resolution_minutes": RESOLUTION_MINUTES},
        "families": families,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    for name, found in families.items():
        modes = {mode: (each.get("max_rel_diff"), each["applies"]) for mode, each in found["modes"].items()}
        print(name, modes)


if __name__ == "__main__":
    main()
