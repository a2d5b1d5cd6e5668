"""Evaluation: the backtest, its driver side (``driver/``) apart from its actor side (``actor/``).

``driver/`` plans, dispatches through :mod:`distributed_onnx.runtime` and merges; ``actor/`` runs one part
(Ray-free). The root holds only what both share: the settings, the run directory's files (:mod:`.outputs`), a
part's sums (:mod:`.sums`), the messages between the sides (:mod:`.part_messages`), the fans and the grouping;
``data/`` reads the input and packs batches, ``scoring/`` holds the metrics, ``report/`` draws report.html.
The Python API is :func:`distributed_onnx.backtest`; this package is named apart from it so both import cleanly.
"""
