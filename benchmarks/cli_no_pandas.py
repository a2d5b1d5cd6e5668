"""``distributed-onnx`` as the ``.[cpu]`` install runs it (no pandas), from a venv that has pandas (the dev venv).

pyarrow imports pandas at some conversions when it is installed (0.3-1 s of a process's CPU, measured); the
command as ``make backtest`` installs it never has it. ``time_to_results.py --cli-from-this-python`` runs the
command through this file when ``.venv-cli`` is not there, so both trees compared pay the same imports.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoPandas:
    """A meta path finder that says pandas is not installed."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not installed in the .[cpu] install")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _NoPandas())  # type: ignore[arg-type]
    from distributed_onnx.cli import main

    sys.exit(main())
