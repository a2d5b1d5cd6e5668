"""The reference checkpoint: a small Chronos-2-contract model trained on the bundled Taylor series.

Only the build script (``scripts/build_reference_checkpoint.py``) and the tests import this subpackage.
``data`` needs numpy and pyarrow only; ``model``, ``training`` and ``export`` need torch and onnx (the
``export`` extra), so nothing here is imported eagerly.
"""
