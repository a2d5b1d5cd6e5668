"""Adapters whose model forecasts groups of windows jointly (cross-learning), as an optional capability.

Chronos-2 attends across the rows that share a ``group_ids`` value. By default every window is its own group;
with ``--group-by`` the backtest says which windows belong together, and an adapter that can honour it
implements :class:`GroupingAdapter` besides :class:`~.base.ModelAdapter`. A family without it is refused
before any part runs (the plan checks :func:`supports_groups`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class GroupingAdapter(Protocol):
    """:meth:`~.base.ModelAdapter.build_inputs` with the windows' groups."""

    def build_grouped_inputs(
        self, context: np.ndarray, covariates: np.ndarray | None, groups: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """As ``build_inputs``; windows with equal ``groups`` (int64 ``[W]``) are forecast jointly."""
        ...


def supports_groups(adapter: object) -> bool:
    return isinstance(adapter, GroupingAdapter)
