"""The backtest's actor side: one part forecast, written and scored, Ray-free (``runtime/actors.py`` hosts it).

It reads only what both sides share (:mod:`distributed_onnx.evaluation.part_messages`, ``data/``, ``scoring/``)
and never the driver's modules; the ``backtest-sides`` import contract holds that.
"""
