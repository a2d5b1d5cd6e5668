"""The statistics of a parity report: how far one forecast lies from the one it must equal (numpy only).

Every parity report computes them alike: the export's (ONNX Runtime against the upstream pipeline,
:func:`.parity_check.parity_report`) and a variant's (the variant against its parent,
:func:`.variants.compare_to_parent`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["parity_statistics"]


def parity_statistics(ours: np.ndarray, reference: np.ndarray, reference_name: str) -> dict[str, float]:
    """How far ``ours`` lies from ``reference`` (the same shape): the statistics of every parity report, the
    export's against upstream and a variant's against its parent.

    ``max_abs_diff`` and ``median_abs_diff``; ``max_rel_diff``, the largest difference over the largest reference
    magnitude (what :data:`.parity_check.PARITY_TOLERANCE` bounds: one scale for the whole forecast, so a near-zero
    value does not inflate it); and that magnitude, as ``max_abs_<reference_name>``.

    >>> parity_statistics(np.array([1.0, 2.5]), np.array([1.0, 2.0]), "parent")
    {'max_abs_diff': 0.5, 'max_rel_diff': 0.25, 'median_abs_diff': 0.25, 'max_abs_parent': 2.0}
    """
    difference = np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(reference, dtype=np.float64))
    scale = float(np.max(np.abs(reference))) or 1.0
    return {
        "max_abs_diff": float(difference.max()),
        "max_rel_diff": float(difference.max() / scale),
        "median_abs_diff": float(np.median(difference)),
        f"max_abs_{reference_name}": scale,
    }
