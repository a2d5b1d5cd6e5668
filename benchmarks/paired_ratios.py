"""The median of paired ratios with its 95% bootstrap interval: how the rounds method reads a set of pairs.

``ratios`` are one number per round (the side with the mechanism / without it, or removed / kept); the interval
resamples the rounds 10,000 times with seed 0 (benchmarks/results/mechanisms.md). Run on a ``time_to_results``
JSON it prints the ``make_backtest`` comparison::

    .venv/bin/python benchmarks/paired_ratios.py benchmarks/results/mechanisms_end_imports.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def summary(ratios: Sequence[float], resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Median, interquartile range, 95% bootstrap interval of the median, and the rounds below / above 1."""
    values = np.asarray(ratios, dtype=np.float64)
    draws = np.random.default_rng(seed).choice(values, size=(resamples, values.size), replace=True)
    medians = np.median(draws, axis=1)
    return {
        "rounds": int(values.size),
        "median": float(np.median(values)),
        "iqr": [float(np.quantile(values, 0.25)), float(np.quantile(values, 0.75))],
        "interval_95": [float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))],
        "below_1": int((values < 1).sum()),
        "above_1": int((values > 1).sum()),
    }


def main() -> None:
    report = json.loads(Path(sys.argv[1]).read_text())["make_backtest"]
    with_s, without_s = report["this tree rounds"]["process_s"], report["baseline rounds"]["process_s"]
    print(json.dumps({**summary(report["paired_ratio_this_over_baseline"]), "median_s": [
        float(np.median(with_s)), float(np.median(without_s))]}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
