"""Live evaluation in one package: the forecast log (:mod:`.log`) and ``distributed-onnx score`` (:mod:`.score`).

Two layers of the package's layering: Serve imports :mod:`.log` to write what it answered (below the backtest,
no Ray), and ``score`` runs :mod:`.score`, which reads that log and scores it with the backtest's own code
(above :mod:`distributed_onnx.evaluation`). Nothing is imported here, so importing the log loads no scoring.
"""
