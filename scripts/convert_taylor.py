"""Convert pmdarima's bundled Taylor (2003) electricity demand series into the project's long Parquet format.

The values live as a literal list inside ``pmdarima/datasets/taylor.py`` (MIT licence). This script reads that
module's source text, from a pmdarima wheel or from the unzipped module, without importing pmdarima: the
literal list is extracted with ``ast`` and nothing of pmdarima is executed.

    python scripts/convert_taylor.py /tmp/dl/pmdarima-2.1.1-*.whl
    python scripts/convert_taylor.py /tmp/dl/pmd/pmdarima/datasets/taylor.py

Output: ``distributed_onnx/resources/taylor.parquet`` with ``series_id`` (string, "taylor_ew"), ``timestamp``
(timestamp[us, tz=UTC], 2000-06-05 00:00 every 30 minutes) and ``y`` (float64, MW).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MODULE_IN_WHEEL = "pmdarima/datasets/taylor.py"
SERIES_ID = "taylor_ew"
EXPECTED_POINTS = 4032  # 84 days x 48 half-hours, 5 June - 27 August 2000
START_UTC = dt.datetime(2000, 6, 5, tzinfo=dt.UTC)
RESOLUTION = dt.timedelta(minutes=30)
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "distributed_onnx" / "resources" / "taylor.parquet"


def read_module_source(source: Path) -> str:
    """The text of ``taylor.py``, from a wheel (zip) or the module file itself."""
    if not source.is_file():
        raise SystemExit(f"{source} does not exist: pass a pmdarima wheel or the path of taylor.py")
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as wheel:
            if MODULE_IN_WHEEL not in wheel.namelist():
                raise SystemExit(f"{source} has no {MODULE_IN_WHEEL}: is it a pmdarima wheel?")
            return wheel.read(MODULE_IN_WHEEL).decode("utf-8")
    return source.read_text(encoding="utf-8")


def extract_values(module_source: str) -> np.ndarray:
    """The one long numeric list literal in the module (the ``np.array([...])`` argument), as float64."""
    candidates = [
        node for node in ast.walk(ast.parse(module_source)) if isinstance(node, ast.List) and len(node.elts) > 100
    ]
    if len(candidates) != 1:
        raise SystemExit(f"expected exactly one long list literal in taylor.py, found {len(candidates)}")
    values = np.asarray(ast.literal_eval(candidates[0]), dtype=np.float64)
    if values.shape != (EXPECTED_POINTS,) or not np.isfinite(values).all():
        raise SystemExit(f"expected {EXPECTED_POINTS} finite values, got shape {values.shape}")
    return values


def to_table(values: np.ndarray) -> pa.Table:
    """Long format: one series on a regular 30-minute UTC grid."""
    start_us = int(START_UTC.timestamp() * 1_000_000)
    step_us = int(RESOLUTION.total_seconds() * 1_000_000)
    timestamps = start_us + step_us * np.arange(values.size, dtype=np.int64)
    return pa.table(
        {
            "series_id": pa.array([SERIES_ID] * values.size, type=pa.string()),
            "timestamp": pa.array(timestamps, type=pa.timestamp("us", tz="UTC")),
            "y": pa.array(values, type=pa.float64()),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="pmdarima wheel (.whl) or pmdarima/datasets/taylor.py")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Parquet file to write")
    args = parser.parse_args(argv)

    table = to_table(extract_values(read_module_source(args.source)))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.output, compression="zstd")
    last = table.column("timestamp")[-1].as_py()
    print(f"wrote {table.num_rows} rows ({START_UTC:%Y-%m-%d %H:%M} .. {last:%Y-%m-%d %H:%M} UTC) to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
