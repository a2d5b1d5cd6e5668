"""The default part count follows the actors, and a rerun plans the parts it resumes whatever its cluster."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from distributed_onnx.evaluation import outputs, run_manifest
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan
from distributed_onnx.evaluation.planning._part_count import (
    LEGACY_ROWS_PER_BATCH,
    MAX_PARTS,
    MIN_PARTS,
    batch_cap,
    default_ramp_width,
    default_rows_per_batch,
    default_windows_per_part,
    dispatch_order,
    plan_parts,
    recorded_part_size,
)
from distributed_onnx.location import Location


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
    assert recorded_part_size(Location(tmp_path), outputs.MANIFEST) is None
    (tmp_path / outputs.MANIFEST).write_text(
        json.dumps({"fingerprint": "f", "windows_per_part": 1280, "ramp_width": 8})
    )
    assert recorded_part_size(Location(tmp_path), outputs.MANIFEST) == (1280, 8, "f", 0)
    (tmp_path / outputs.MANIFEST).write_text(
        json.dumps({"fingerprint": "f", "windows_per_part": 64, "ramp_width": 2, "rows_per_batch": 32})
    )
    assert recorded_part_size(Location(tmp_path), outputs.MANIFEST) == (64, 2, "f", 32)
    (tmp_path / outputs.MANIFEST).write_text(json.dumps({"fingerprint": "g", "settings": {}}))
    assert recorded_part_size(Location(tmp_path), outputs.MANIFEST) == (0, 1, "g", 0)


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
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.planning._part_count import MANIFEST_KEY, RAMP_KEY
    from distributed_onnx.evaluation.settings import BacktestSettings

    data = _series(tmp_path / "series.parquet")

    def settings(output: Path, actors: int, **more: Any) -> BacktestSettings:
        values = {"n_windows": 500, "rows_per_batch": 4, "cpus_per_actor": 1.0, "progress": False, **more}
        return BacktestSettings(
            checkpoint=tiny_checkpoint.weights_path, data=data, output=output, actors=actors, **values
        )

    first = prepare(settings(tmp_path / "run", actors=2))
    record = {MANIFEST_KEY: first.windows_per_part, RAMP_KEY: first.ramp_width}
    run_manifest.prepare_output(Location(tmp_path / "run"), first.run_fingerprint, record)
    fresh = prepare(settings(tmp_path / "other", actors=20))
    assert fresh.parts() != first.parts()  # more actors, more parts: the default follows the cluster

    rerun = prepare(settings(tmp_path / "run", actors=20))
    assert (rerun.parts(), rerun.run_fingerprint) == (first.parts(), first.run_fingerprint)

    # A directory of before the size was recorded: its plan (about 64 parts) is found by its fingerprint.
    old = prepare(settings(tmp_path / "old", actors=2, windows_per_part=default_windows_per_part(1000, 4)))
    run_manifest.prepare_output(Location(tmp_path / "old"), old.run_fingerprint, {})
    resumed = prepare(settings(tmp_path / "old", actors=20))
    assert (resumed.parts(), resumed.run_fingerprint) == (old.parts(), old.run_fingerprint)


def _default_parts(windows: int, actors: int, cap: int = 256) -> tuple[int, list[PartSpec]]:
    rows = default_rows_per_batch(windows, actors, cap)
    size = default_windows_per_part(windows, rows, actors)
    return rows, plan_parts(_plan(windows), size, rows, default_ramp_width(actors) if size > rows else 1)


@pytest.mark.parametrize(("windows", "actors"), [(32, 2), (3, 2), (100, 4), (511, 2)])
def test_a_small_run_gives_every_actor_work(windows: int, actors: int) -> None:
    """32 windows on 2 actors used to be one part of one 256-row batch: one actor had nothing to do."""
    rows, parts = _default_parts(windows, actors)
    assert len(parts) >= min(windows, actors * 2)
    assert all(part.n_windows <= max(rows, 1) for part in parts)  # a part is whole batches; a batch <= the part
    # The dispatcher hands the parts out one by one to whichever actor is idle: with as many parts as actors,
    # each actor's first pull gets one (the first ``actors`` parts of the dispatch order are distinct parts).
    assert len({part.index for part in dispatch_order(parts, actors)[:actors]}) == actors
    if (windows, actors) == (32, 2):
        assert rows == 4 and len(parts) == 8  # parts of one 4-row batch: 4 per actor (a 2-row call costs more)


def test_600_windows_make_at_least_16_parts() -> None:
    rows, parts = _default_parts(600, 2)
    assert len(parts) >= 16 and rows <= 38
    _, more = _default_parts(600, 8)  # more actors, smaller parts
    assert len(more) >= 7 * 8 and sum(part.n_windows for part in more) == 600


def test_a_large_graph_takes_smaller_batches() -> None:
    assert batch_cap(4_000_000, 512) == 256  # the bundled reference graph
    assert batch_cap(193_000_000, 2048) < 256  # Chronos-Bolt at bolt-small's shapes
    assert batch_cap(480_000_000, 8192) <= batch_cap(193_000_000, 2048)  # Chronos-2 at the published shapes
    rows, parts = _default_parts(150_000, 2, cap=batch_cap(480_000_000, 8192))
    assert rows == batch_cap(480_000_000, 8192) and len(parts) >= 16
    assert default_rows_per_batch(150_000, 2, 256) == LEGACY_ROWS_PER_BATCH  # a large run: the batch of before
    assert default_rows_per_batch(32, 2, 256, gpu_actors=True) == LEGACY_ROWS_PER_BATCH  # a GPU keeps its batch


def _sizes_settings(tmp_path: Path, checkpoint: Path, output: Path, actors: int, **more: Any) -> Any:
    from distributed_onnx.evaluation.settings import BacktestSettings

    data = tmp_path / "series.parquet"
    if not data.exists():
        _series(data, n_series=2, length=600)
    values = {"n_windows": 16, "cpus_per_actor": 1.0, "progress": False, **more}
    return BacktestSettings(checkpoint=checkpoint, data=data, output=output, actors=actors, **values)


def test_the_plan_of_32_windows_on_2_actors_uses_both(tmp_path: Path, tiny_checkpoint: Any) -> None:
    """Through the planner (the checkpoint's graph, the data's windows), at the defaults."""
    from distributed_onnx.evaluation.planning import prepare

    plan = prepare(_sizes_settings(tmp_path, tiny_checkpoint.weights_path, tmp_path / "run", actors=2))
    parts = plan.parts()
    assert plan.windows.planned == 32 and len(parts) >= 2
    assert plan.rows_per_batch <= min(part.n_windows for part in parts[:-1])
    assert plan.job(source=None).rows_per_batch == plan.rows_per_batch  # type: ignore[arg-type]


def test_a_rerun_resumes_with_the_recorded_sizes(tmp_path: Path, tiny_checkpoint: Any) -> None:
    """Sizes chosen from the windows and actors are recorded in run.json; a rerun on another cluster takes them."""
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.planning._part_count import MANIFEST_KEY, RAMP_KEY, ROWS_KEY

    weights = tiny_checkpoint.weights_path
    first = prepare(_sizes_settings(tmp_path, weights, tmp_path / "run", actors=2))
    record = {MANIFEST_KEY: first.windows_per_part, RAMP_KEY: first.ramp_width, ROWS_KEY: first.rows_per_batch}
    run_manifest.prepare_output(Location(tmp_path / "run"), first.run_fingerprint, record)
    fresh = prepare(_sizes_settings(tmp_path, weights, tmp_path / "fresh", actors=8))
    assert fresh.rows_per_batch != first.rows_per_batch  # the default follows the actors
    rerun = prepare(_sizes_settings(tmp_path, weights, tmp_path / "run", actors=8))
    assert (rerun.rows_per_batch, rerun.parts(), rerun.run_fingerprint) == (
        first.rows_per_batch,
        first.parts(),
        first.run_fingerprint,
    )

    # An explicit part size: the batch chosen for it is recorded and taken too.
    fixed = prepare(_sizes_settings(tmp_path, weights, tmp_path / "fixed", actors=2, windows_per_part=8))
    record = {MANIFEST_KEY: fixed.windows_per_part, RAMP_KEY: 1, ROWS_KEY: fixed.rows_per_batch}
    run_manifest.prepare_output(Location(tmp_path / "fixed"), fixed.run_fingerprint, record)
    again = prepare(_sizes_settings(tmp_path, weights, tmp_path / "fixed", actors=4, windows_per_part=8))
    assert (again.rows_per_batch, again.run_fingerprint) == (fixed.rows_per_batch, fixed.run_fingerprint)

    # A directory of before the batch was chosen: batches of 256 and parts for its actors, found by fingerprint.
    old = prepare(_sizes_settings(tmp_path, weights, tmp_path / "old", actors=2, rows_per_batch=256))
    run_manifest.prepare_output(Location(tmp_path / "old"), old.run_fingerprint, {MANIFEST_KEY: old.windows_per_part})
    resumed = prepare(_sizes_settings(tmp_path, weights, tmp_path / "old", actors=4))
    assert (resumed.rows_per_batch, resumed.parts(), resumed.run_fingerprint) == (
        256,
        old.parts(),
        old.run_fingerprint,
    )


def test_explicit_sizes_are_honoured(tmp_path: Path, tiny_checkpoint: Any) -> None:
    from distributed_onnx.evaluation.planning import prepare

    weights = tiny_checkpoint.weights_path
    both = prepare(_sizes_settings(tmp_path, weights, tmp_path / "a", 2, rows_per_batch=8, windows_per_part=16))
    assert (both.rows_per_batch, both.windows_per_part) == (8, 16)
    assert [part.n_windows for part in both.parts()] == [8, 16, 8]  # the first part is one batch
    rows = prepare(_sizes_settings(tmp_path, weights, tmp_path / "b", 2, rows_per_batch=5))
    assert rows.rows_per_batch == 5 and all(part.n_windows % 5 == 0 for part in rows.parts()[:-1])
    part = prepare(_sizes_settings(tmp_path, weights, tmp_path / "c", 2, windows_per_part=4))
    assert part.windows_per_part == 4 and part.rows_per_batch <= 4
