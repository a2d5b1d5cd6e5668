"""The backtest's driver side, stages 3 and 4: the plan's parts run through :mod:`distributed_onnx.runtime`, merged
and reported.

Its front doors are two public modules: :mod:`.run` (``run(RunPlan) -> RunScores``: the parts dispatched, their
sums verified and merged, ``metrics.parquet``) and :mod:`.report` (``report(RunScores) -> BacktestResult``: the
leaderboard, report.html, summary.json). Two more are public because the command needs them before it imports
the rest of the backtest (they import nothing heavy): :mod:`.early` (Ray and the pool started while the data is
read) and :mod:`.clock` (the run's phases); :mod:`.merge`, which ``tune``'s accuracy gate merges its in-process
parts with too; and :mod:`.report_process`, the report's child process, which runs as its own ``-m`` module. The
modules behind them (``_summary``, ``_transport``, ``_dispatching``, ...) are private to the driver: the
``stages-private`` import contract refuses an import of them from outside it. The actor side is :mod:`..actor`;
what both share sits at the root of :mod:`distributed_onnx.evaluation`. This module imports nothing, so importing
:mod:`.early` stays cheap.
"""
