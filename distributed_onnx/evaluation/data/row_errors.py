"""The error of rows at fault in the input: the file, what is wrong, and the first rows (0-based data rows).

Every check of the input that can point at rows (the table's validation, its column values, the streamed reader,
the groups and the vintages) says so in one form, so that a user reads the same line whichever check failed.
"""

from __future__ import annotations

import numpy as np

from distributed_onnx.errors import DataError

_MAX_ROWS_IN_MESSAGE = 5


def rows_error(source: str, before: str, rows: np.ndarray, after: str = "") -> DataError:
    """``{source}: {before} [r1, r2, ...]{after}``, the first rows also in the error's ``rows`` field."""
    message = f"{source}: {before} {rows_text(rows)}{after}"
    return DataError(message, path=source, rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist())


def rows_text(rows: np.ndarray) -> str:
    """``[r1, r2, ...] and N more``: the first rows a message names."""
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_ROWS_IN_MESSAGE])
    more = f" and {len(rows) - _MAX_ROWS_IN_MESSAGE} more" if len(rows) > _MAX_ROWS_IN_MESSAGE else ""
    return f"[{shown}]{more}"
