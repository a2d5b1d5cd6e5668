"""Stage 1 of a backtest, load: the user's files read and checked once -> :class:`Dataset`.

``load(settings, spec, resolution_minutes)`` reads the input table (streamed when it is a large sorted Parquet
file), maps its columns to the project's names, checks it, counts each series' windows, and reads the
covariates' roles, each series' group (``--group-by``) and the vintage table (``--covariate-data``). Planning
(:mod:`distributed_onnx.evaluation.planning`) reads the data only through the :class:`Dataset` it returns.

The modules behind this one are private to the stage (``_load``, ``_scan``, ``_groups``, ``_vintages``): the
``stages-private`` import contract refuses an import of them from outside the stage.
"""

from distributed_onnx.evaluation.dataset._load import Dataset, load

__all__ = ["Dataset", "load"]
