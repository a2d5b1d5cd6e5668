"""A metric registered for one test only (tests/test_metric_reach.py), in a module of its own so the report
process, which is sent the driver's registered metrics pickled, can import its class."""

from __future__ import annotations

from distributed_onnx.evaluation.scoring.registry import F64, Metric, Sums


class Throwaway(Metric):
    """Twice the MAE (``2 sum |y - q0.5| / n``): exactly 2 x MAE in every scope, convention and resample, so each
    output's value is checked against MAE's, and it is made primary (``primary_rank`` below MASE's 0)."""

    name = "throwaway"
    needs_median = True
    skill = True
    headline = True
    report_rank = 5
    primary_rank = -1

    def value(self, sums: Sums) -> F64:
        return 2.0 * sums.mean("abs_err", "pairs")
