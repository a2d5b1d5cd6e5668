"""The backtest's driver side: the plan, the parts sent through :mod:`distributed_onnx.runtime`, the merge.

Nothing per window passes through here: :mod:`.plan` checks the inputs and cuts the windows into parts,
:mod:`.run` hands each actor its job once and the dispatcher its parts, :mod:`.merge` folds the parts' sums,
:mod:`.summary` and :mod:`.failures` write what the run did. The actor side is :mod:`..actor`; what both share
sits at the root of :mod:`distributed_onnx.evaluation`.
"""
