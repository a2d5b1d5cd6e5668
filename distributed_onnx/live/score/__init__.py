"""Live evaluation: ``distributed-onnx score``, the forecast log joined with the actuals and scored as a backtest.

Reading and joining (:mod:`.log_windows`, :mod:`.join`) apart from scoring and writing (:mod:`.scoring`,
:mod:`.batches`, :mod:`.versus_backtest`); the report is :mod:`distributed_onnx.live.score.report`.
"""

from distributed_onnx.live.score.scoring import ScoreResult, score_log

__all__ = ["ScoreResult", "score_log"]
