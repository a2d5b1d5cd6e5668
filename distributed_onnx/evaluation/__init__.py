"""Evaluation: the backtest, four stages behind one front door (:func:`.backtest.run_backtest`).

``load -> plan -> run -> report``, each stage called once and handing the next one frozen record:
``dataset/`` (``load(settings) -> Dataset``: the user's files read and checked once), ``planning/``
(``resolve(settings) -> Checkpoints``, ``plan(...) -> RunPlan``), ``driver/`` (``run(RunPlan) -> RunScores``
through :mod:`distributed_onnx.runtime`, ``report(RunScores) -> BacktestResult``). A stage's inner modules are
private to it (``_name.py``). ``actor/`` runs one part (Ray-free). The root holds only what both sides share: the
settings, the run directory's layout and part files (:mod:`.outputs`), the checks of an output folder before a run
(:mod:`.output_checks`), the run's record ``run.json`` (:mod:`.run_manifest`), the clean-up of what is not this
run's (:mod:`.output_cleanup`), a part's sums (:mod:`.sums`), the messages between the sides (:mod:`.part_messages`),
the fans and the grouping; ``data/`` holds the series' layout, windows and batch packing both sides use,
``scoring/`` the metrics, ``report/`` draws report.html.
The Python API is :func:`distributed_onnx.backtest`; this package is named apart from it so both import cleanly.
"""
