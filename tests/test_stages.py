"""Unit tier: the backtest's stages hand each other frozen records, and only the load stage reads the user's files.

``resolve -> load -> plan`` (docs/design.md, "The backtest's stages"): the plan is built from the checkpoints and
the :class:`~distributed_onnx.evaluation.dataset.Dataset` alone, so it plans the same run with the input file
gone; a grouped run takes each series' group from the read that laid its series out (it read the file twice).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx import storage
from distributed_onnx.evaluation import dataset, planning
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from tests.backtest_data import SERIES_LENGTHS, dense_series, long_table, settings_for, write_dataset


def _grouped(path: Path) -> Path:
    """The test data with a per-series ``region`` (series a and c in one group, b in another)."""
    table = long_table(dense_series(), covariate=False)
    region = {name: group for name, group in zip(SERIES_LENGTHS, ["north", "south", "north"], strict=True)}
    pq.write_table(
        table.append_column("region", pa.array([region[one] for one in table["series_id"].to_pylist()])), path
    )
    return path


def test_the_plan_reads_the_data_only_through_the_dataset(tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint) -> None:
    data = write_dataset(tmp_path / "data.parquet")
    settings = settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", covariates=["temp"])
    expected = planning.prepare(settings)

    models = planning.resolve(settings)
    loaded = dataset.load(settings, models.spec, models.resolution_minutes)
    data.unlink()  # whatever the plan needs of the data, the Dataset holds
    plan = planning.plan(settings, models, loaded)

    assert (plan.run_fingerprint, plan.window_fingerprint) == (expected.run_fingerprint, expected.window_fingerprint)
    assert plan.model_fingerprints == expected.model_fingerprints
    assert [part.stop for part in plan.parts()] == [part.stop for part in expected.parts()]
    assert plan.dataset is loaded and plan.models is models
    for record in (models, loaded, plan):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.notes = []  # type: ignore[misc]


def test_a_grouped_run_reads_its_input_once(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _grouped(tmp_path / "data.parquet")
    settings = settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", group_by="region")
    reads: list[Any] = []
    read_parquet = storage.read_parquet

    def counted(location: Any, *args: Any, **kwargs: Any) -> pa.Table:
        reads.append(location)
        return read_parquet(location, *args, **kwargs)

    monkeypatch.setattr(storage, "read_parquet", counted)
    plan = planning.prepare(settings)

    assert plan.grouping is not None and plan.grouping.planned == plan.windows.planned
    assert reads.count(settings.data) == 1, reads  # the series and their groups from one read
