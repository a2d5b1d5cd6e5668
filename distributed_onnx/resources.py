"""Paths of the files bundled with the package: the reference checkpoint and the Taylor dataset."""

from __future__ import annotations

from pathlib import Path

RESOURCES_DIR = Path(__file__).parent / "resources"

#: Half-hourly electricity demand, England and Wales, 5 June - 27 August 2000 (see resources/README.md).
REFERENCE_DATASET = RESOURCES_DIR / "taylor.parquet"

#: The small Chronos-2-contract patch transformer trained on the Taylor data (scripts/build_reference_checkpoint.py).
REFERENCE_CHECKPOINT = RESOURCES_DIR / "reference" / "taylor_chronos2_patchtst.onnx"
