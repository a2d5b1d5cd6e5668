"""The driver's merge of the per-origin sums: a part costs its own rows, not every origin merged before it.

``WindowSums`` folds the rows added into its sums per origin only when they are read or have outnumbered the rows
kept; these tests pin that (a fold at every merge made the merge quadratic in the parts for distinct origins) and
that the sums stay those of a fold at every merge, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from distributed_onnx.evaluation.scoring import conventions
from distributed_onnx.evaluation.scoring.conventions import WindowSums

QUANTILES = (0.1, 0.5, 0.9)
WIDTH = 7 + len(QUANTILES)


def _parts(n_parts: int, seed: int) -> list[WindowSums]:
    """Parts as actors write them: each its own batches, origins overlapping the other parts' (and -0.0 rows)."""
    rng = np.random.default_rng(seed)
    parts = []
    for index in range(n_parts):
        part = WindowSums(QUANTILES, 1)
        for _ in range(3):
            origins = np.sort(rng.choice(np.arange(index * 5, index * 5 + 400), size=30, replace=False))
            block = rng.normal(size=(origins.size, WIDTH))
            block[rng.random(origins.size) < 0.1] = -0.0
            part._add(origins.astype(np.int64), block)
        parts.append(part)
    return parts


def test_merged_sums_equal_a_fold_at_every_merge_bit_for_bit() -> None:
    deferred, eager = WindowSums(QUANTILES, 1), WindowSums(QUANTILES, 1)
    for part in _parts(300, seed=4):
        deferred.merge(part)
        eager.merge(part)
        eager.sums  # noqa: B018 - read: the old behaviour, a fold at every merge
    np.testing.assert_array_equal(deferred.origins, eager.origins)
    np.testing.assert_array_equal(deferred.sums.view(np.uint64), eager.sums.view(np.uint64))
    assert not np.signbit(deferred.sums[deferred.sums == 0]).any()  # every sum is 0.0 + its rows


def test_merging_parts_of_new_origins_folds_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    folds = []
    after = conventions._after
    monkeypatch.setattr(conventions, "_after", lambda kept, origins: folds.append(kept.size) or after(kept, origins))
    monkeypatch.setattr(conventions, "FOLD_AFTER_ROWS", 64, raising=False)
    merged = WindowSums(QUANTILES, 1)
    rng = np.random.default_rng(5)
    for index in range(2000):  # 2,000 parts of 20 origins each, none seen before: 40,000 origins
        origins = np.arange(index * 20, index * 20 + 20, dtype=np.int64)
        part = WindowSums(QUANTILES, 1)
        part._add(origins, rng.normal(size=(20, WIDTH)))
        merged.merge(part)
    assert merged.origins.size == 40_000
    parts_folds = len(folds) - 2000  # each part folds its own batch once, when merged
    assert parts_folds <= 2 * int(np.log2(2000)) + 2  # the rows kept double between two folds
    assert sum(folds) < 4 * 40_000  # every fold's rows kept, together: a constant per row, not per part
