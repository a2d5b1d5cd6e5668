"""Evaluation: the backtest. Planning, the actors' part runner, metric sums, merge, summary and report.

``data/`` reads and lays out the input table, plans windows and packs model batches; ``scoring/`` holds the
metrics and the baselines; ``report/`` draws report.html. Everything here is Ray-free except
:mod:`~distributed_onnx.evaluation.run`, which schedules through :mod:`distributed_onnx.runtime`. The Python
API is :func:`distributed_onnx.backtest`; this package is named apart from it so both import cleanly.
"""
