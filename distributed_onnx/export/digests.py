"""The exported checkpoint's digests, kept by the export for the first command that runs it.

Every command that runs a checkpoint needs its identity (the sha256 of its files); the export has just written
them, so it hashes large ones itself (:func:`remember_digests`) rather than leave that to the next backtest.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from distributed_onnx.errors import DistributedOnnxError

logger = logging.getLogger(__name__)

#: The size of a checkpoint's files from which the export hashes them itself (:func:`remember_digests`): below it,
#: hashing when first asked costs less than the export's wait for the racy window (sha256 runs at hundreds of MB/s).
KEEP_DIGESTS_FROM_BYTES = 64 << 20


def remember_digests(weights_path: Path) -> None:
    """Hash the written checkpoint's files now, into this machine's digest cache (:mod:`~..model.file_digests`).

    Every command that runs a checkpoint asks for its identity, which covers the sha256 of its external weights
    (:mod:`~..model.identity`); hashed by the first backtest after the export, a gigabyte of weights was seconds of
    that backtest's planning. The export has just written the files, and minutes of it make seconds of hashing
    small: the next command finds the digests kept. A file written less than :data:`~..model.file_digests.RACY_S`
    ago is not kept (its version could not tell a second write in the same tick), so the export waits out that
    rest first (a tiny model's parity can end sooner). Weights smaller than :data:`KEEP_DIGESTS_FROM_BYTES` are
    left to the first command that asks (hashing them then costs less than that wait: every tiny export of the
    test suite waited it, twice with an int8 variant). Best effort: what cannot be hashed or kept now is hashed
    when first asked for, as before.
    """
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.model.external_data import external_data_locations
    from distributed_onnx.model.file_digests import RACY_S
    from distributed_onnx.model.identity import identity_of

    try:
        files = [weights_path, *(weights_path.parent / each for each in external_data_locations(weights_path))]
        if sum(each.stat().st_size for each in files) < KEEP_DIGESTS_FROM_BYTES:
            return
        newest_ns = max(each.stat().st_mtime_ns for each in files)
        time.sleep(max(0.0, RACY_S + 0.1 - (time.time_ns() - newest_ns) / 1e9))
        identity_of(LocalCheckpoint(path=weights_path).resolve())
    except (OSError, DistributedOnnxError) as exc:
        logger.debug("Digests of %s not kept now (%s); the first command to need them hashes them", weights_path, exc)
