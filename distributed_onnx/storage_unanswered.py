"""Whether a storage error says the store did not answer (exit 3, rerun later) or answered (exit 2).

Every reader's and writer's error goes through :func:`unanswered`, whatever the scheme: the location reads and
writes (:mod:`distributed_onnx.storage`) and the http(s) handler (:mod:`distributed_onnx.storage_http`) both
classify with it, so it sits apart from both, and neither imports the other for it.
"""

from __future__ import annotations

#: Words of pyarrow's and the stores' errors that say the store was not reached (pyarrow's S3 raises a bare OSError
#: carrying curl's code): refused, unreachable, not resolved, timed out.
_UNANSWERED_WORDS = (
    "could not connect",
    "couldn't connect",
    "failed to connect",
    "connection refused",
    "curlcode: 6,",
    "curlcode: 7,",
    "curlcode: 28,",
    "network is unreachable",
    "timed out",
    "could not resolve",
    "name or service not known",
)


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the storage did not answer - a refused or unreachable
    store, a name that does not resolve, a timeout - rather than that it answered (no such file, no permission).
    The one classification every reader's error goes through (:func:`~distributed_onnx.storage.read_error`)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError) or type(seen).__name__ in {"ClientConnectorError"}:
            return True
        if isinstance(seen, OSError) and any(word in str(seen).lower() for word in _UNANSWERED_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
