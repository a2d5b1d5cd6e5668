"""The default part count follows the actors, and a rerun plans the parts it resumes whatever its cluster."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan
from distributed_onnx.evaluation.driver.part_count import (
    MAX_PARTS,
    MIN_PARTS,
    default_ramp_width,
    default_windows_per_part,
    dispatch_order,
    plan_parts,
    recorded_part_size,
)


def _plan(windows: int) -> WindowPlan:
    return WindowPlan(np.array([windows]), np.array([0, windows]), skipped=0, capped=0, capped_series=())


def _parts(windows: int, actors: int | None, rows_per_batch: int = 256) -> list[PartSpec]:
    size = default_windows_per_part(windows, rows_per_batch, actors)
    return plan_parts(_plan(windows), size, rows_per_batch, default_ramp_width(actors))


@pytest.mark.parametrize(
    ("windows", "actors", "low", "high"), [(150_000, 2, 10, 16), (10_000_000, 64, 8, 16), (10_000_000, 1000, 8, 12)]
)
def test_the_default_gives_every_actor_several_parts(windows: int, actors: int, low: int, high: int) -> None:
    parts = _parts(windows, actors)
    assert low <= len(parts) / actors <= high
    covered = [(part.start, part.stop) for part in parts]
    assert covered[0][0] == 0 and covered[-1][1] == windows
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(covered))
    assert all(part.n_windows % 256 == 0 for part in parts[:-1])  # whole model batches


def test_the_part_count_has_a_floor_and_a_ceiling() -> None:
    assert len(_parts(1_000_000, 1)) >= MIN_PARTS  # a small cluster keeps a fine grain
    assert len(_parts(100_000_000, 100_000)) <= MAX_PARTS + 100_000 * 4  # the ceiling, plus the ramp's parts
    assert default_windows_per_part(100_000_000, 256, 100_000) == 100_000_000 // MAX_PARTS // 256 * 256 + 256


def test_unknown_actors_and_explicit_sizes_plan_as_before() -> None:
    assert default_windows_per_part(150_000, 256) == 2560  # about 64 parts, as every run planned before
    legacy = _plan(150_000).parts(2560, first_part=256)
    assert plan_parts(_plan(150_000), 2560, 256, ramp_width=1) == legacy


def test_the_ramp_is_one_part_per_actor_wide_and_goes_first_then_last() -> None:
    parts = plan_parts(_plan(7424 + 45 * 2048), 2048, 256, ramp_width=4)  # no short last part
    sizes = [part.n_windows for part in parts]
    assert sizes[:13] == [256, *[256] * 4, *[512] * 4, *[1024] * 4]
    order = [part.n_windows for part in dispatch_order(parts, first_wave=4)]
    assert order[:5] == [256] * 5  # each actor's speed is measured on a small part
    assert order[5] == 2048 and order[-8:] == [1024] * 4 + [512] * 4  # then the largest first
    assert sorted(part.index for part in dispatch_order(parts, 4)) == list(range(len(parts)))


def test_the_manifest_records_the_size_and_an_old_one_says_it_has_none(tmp_path: Path) -> None:
    assert recorded_part_size(tmp_path, outputs.MANIFEST) is None
    (tmp_path / outputs.MANIFEST).write_text(
        json.dumps({"fingerprint": "f", "windows_per_part": 1280, "ramp_width": 8})
    )
    assert recorded_part_size(tmp_path, outputs.MANIFEST) == (1280, 8, "f")
    (tmp_path / outputs.MANIFEST).write_text(json.dumps({"fingerprint": "g", "settings": {}}))
    assert recorded_part_size(tmp_path, outputs.MANIFEST) == (0, 1, "g")


def _series(path: Path, n_series: int = 2, length: int = 600) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    stamps = np.datetime64("2024-01-01T00:00", "us") + np.arange(length) * np.timedelta64(30, "m")
    tables = [
        pa.table({"series_id": [f"s{i}"] * length, "timestamp": stamps, "y": np.sin(np.arange(length) / 5.0) + i})
        for i in range(n_series)
    ]
    pq.write_table(pa.concat_tables(tables), path)
    return path


def test_a_rerun_on_another_cluster_plans_the_parts_it_resumes(tmp_path: Path, tiny_checkpoint: Any) -> None:
    """The default follows the actors, yet a directory keeps the plan it was started with (run.json)."""
    from distributed_onnx.evaluation.driver.part_count import MANIFEST_KEY, RAMP_KEY
    from distributed_onnx.evaluation.driver.plan import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings

    data = _series(tmp_path / "series.parquet")

    def settings(output: Path, actors: int, **more: Any) -> BacktestSettings:
        values = {"n_windows": 500, "rows_per_batch": 4, "cpus_per_actor": 1.0, "progress": False, **more}
        return BacktestSettings(
            checkpoint=tiny_checkpoint.weights_path, data=data, output=output, actors=actors, **values
        )

    first = prepare(settings(tmp_path / "run", actors=2))
    record = {MANIFEST_KEY: first.windows_per_part, RAMP_KEY: first.ramp_width}
    outputs.prepare_output(tmp_path / "run", first.run_fingerprint, record)
    fresh = prepare(settings(tmp_path / "other", actors=20))
    assert fresh.parts() != first.parts()  # more actors, more parts: the default follows the cluster

    rerun = prepare(settings(tmp_path / "run", actors=20))
    assert (rerun.parts(), rerun.run_fingerprint) == (first.parts(), first.run_fingerprint)

    # A directory of before the size was recorded: its plan (about 64 parts) is found by its fingerprint.
    old = prepare(settings(tmp_path / "old", actors=2, windows_per_part=default_windows_per_part(1000, 4)))
    outputs.prepare_output(tmp_path / "old", old.run_fingerprint, {})
    resumed = prepare(settings(tmp_path / "old", actors=20))
    assert (resumed.parts(), resumed.run_fingerprint) == (old.parts(), old.run_fingerprint)
