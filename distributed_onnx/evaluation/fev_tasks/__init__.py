"""fev tasks and benchmarks run as backtests (``distributed-onnx fev``, :func:`distributed_onnx.fev_benchmark`).

:mod:`.tasks` turns a ``fev.Task`` into rows of a backtest's input table and window settings and
:mod:`.predictions` the backtest's forecasts into the predictions fev's ``Task.evaluation_summary`` scores (both
pure, no Ray); :mod:`.runner` plans the tasks together, one backtest per run of compatible tasks, and writes
the summaries. fev is an optional extra
(``pip install 'distributed-onnx[fev]'``): only these modules import it, lazily (:func:`.fev_import.load_fev`).
"""
