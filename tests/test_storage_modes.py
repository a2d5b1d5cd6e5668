"""Issue 29, defect 15: output files honour the umask, as directories do (they were 0644 whatever it was)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest

from distributed_onnx import storage
from distributed_onnx.location import Location


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_files_written_get_0666_less_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        storage.write_bytes(Location(tmp_path / "a.json"), b"{}")
        storage.write_parquet(Location(tmp_path / "b.parquet"), pa.table({"x": [1]}))
        storage.make_dirs(Location(tmp_path / "folder"))
    finally:
        os.umask(previous)
    for name in ("a.json", "b.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o777 & ~umask
