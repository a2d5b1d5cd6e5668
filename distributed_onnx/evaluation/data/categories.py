"""Categorical covariates: text, bool or dictionary columns as stable numeric category codes.

Chronos-2's own pipeline takes such columns (``chronos2/preprocess.py``) and target-encodes them per series.
Here a window's encoding is computed from the window's own context at packing time
(:mod:`.window_covariates`); until then a categorical column travels as codes in the same float64 grid as
every numeric column. A code is a digest of the value's text (48 bits: exact in float64), so the driver's read,
an actor's streamed read of a few row groups and a rerun give every value the same code without a shared
dictionary. A null value is a category of its own (:data:`NULL_CATEGORY`, as upstream counts NaN); NaN in the
grid keeps its one meaning, "no row at this step".
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The code of a null value: a category of its own, as upstream's encoding treats NaN.
NULL_CATEGORY = -1.0


def is_categorical(kind: pa.DataType) -> bool:
    """Whether a column of this Arrow type is categorical: text, bool, or dictionary-encoded."""
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_dictionary(kind)
    )


def category_codes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Each row's category code (float64): a digest of the value's text, :data:`NULL_CATEGORY` for null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    text = pc.cast(column, pa.string())
    encoded = pc.dictionary_encode(text)
    values = encoded.dictionary.to_pylist()
    lookup = np.asarray([_code(value) for value in values], dtype=np.float64)
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(-1)
    positions = np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    codes = np.full(positions.shape, NULL_CATEGORY)
    present = positions >= 0
    codes[present] = lookup[positions[present]]
    return codes


def _code(value: str) -> float:
    return float(int.from_bytes(hashlib.blake2b(value.encode(), digest_size=6).digest(), "big"))
