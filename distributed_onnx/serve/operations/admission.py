"""Admission of a replica: requests counted *and* their memory charged, before the memory is spent (pure code).

A count alone does not bound memory: an 8 MB JSON body of ``0,`` holds ~16x its size once parsed into Python
floats, and 192 such requests could be admitted at once. So every request holds a :class:`Ticket` from
arrival to answer: the count (``max_requests``) is taken at once, and memory is charged before it is spent:

- a body is charged ``body bytes x PARSE_BYTES_PER_BODY_BYTE`` from its ``Content-Length`` before a byte of it
  is read (and again as it streams, for a body without one), the measured worst case of reading, parsing and
  planning it (``tests/test_serve_admission.py`` checks the factor against ``tracemalloc`` on hostile bodies);
- a planned forecast is charged its response (``series x horizon x quantiles x RESPONSE_BYTES_PER_VALUE``)
  before the model runs.

When a charge would take the replica over ``max_bytes`` the request is refused with 503 + Retry-After (it may
fit later); a request that could never fit alone (its own charge above ``max_bytes``) gets 413. So the memory
that requests hold in a replica stays under ``max_bytes`` (``ServeSettings.max_request_memory_bytes``): the
replica's RSS stays under its idle RSS plus that (``benchmarks/results/serve_hostile.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distributed_onnx.serve.wire.http import HttpError

#: Peak memory of reading, parsing and planning a request body, per body byte, at worst (measured with
#: tracemalloc: ~28 for one long series of ``0,`` or nested v2 tensor data of ``[0],``, ~23 for many one-value series;
#: plus the body itself and its chunks while joined). Rounded up.
PARSE_BYTES_PER_BODY_BYTE = 40
#: Memory per forecast value of a response: the float32 result, its Python float in the JSON encoder's input
#: and its JSON text (4 + 24 + 8 + ~20), rounded up.
RESPONSE_BYTES_PER_VALUE = 64


@dataclass
class Admission:
    """Requests in a replica and the memory charged to them; one per replica (shared by its models)."""

    max_requests: int
    max_bytes: int
    retry_after_s: float
    requests: int = 0
    charged_bytes: int = 0
    refused: dict[str, int] = field(default_factory=lambda: {"count": 0, "bytes": 0})

    def enter(self) -> Ticket:
        """Take one of ``max_requests`` places, or raise 503; the ticket must be closed (``with``)."""
        if self.requests >= self.max_requests:
            self.refused["count"] += 1
            raise self._overloaded(
                f"this replica holds {self.max_requests} requests (max_ongoing_requests + max_queued_requests)"
            )
        self.requests += 1
        return Ticket(self)

    def _charge(self, ticket: Ticket, total_bytes: int, what: str) -> None:
        more = total_bytes - ticket.charged_bytes
        if more <= 0:
            return
        if total_bytes > self.max_bytes:
            raise HttpError(
                413,
                f"{what} needs ~{_mb(total_bytes)} of memory in the replica, above its limit of "
                f"{_mb(self.max_bytes)} (max_request_memory_bytes); send it in smaller requests.",
            )
        if self.charged_bytes + more > self.max_bytes:
            self.refused["bytes"] += 1
            raise self._overloaded(
                f"{what} needs ~{_mb(total_bytes)} of memory and requests in flight hold "
                f"{_mb(self.charged_bytes)} of the replica's {_mb(self.max_bytes)} (max_request_memory_bytes)"
            )
        self.charged_bytes += more
        ticket.charged_bytes = total_bytes

    def _leave(self, ticket: Ticket) -> None:
        self.requests -= 1
        self.charged_bytes -= ticket.charged_bytes
        ticket.charged_bytes = 0

    def _overloaded(self, why: str) -> HttpError:
        return HttpError(503, f"Overloaded: {why}; retry later.", {"Retry-After": str(math.ceil(self.retry_after_s))})


@dataclass
class Ticket:
    """One admitted request: its place and its memory charge, both given back on close."""

    admission: Admission
    charged_bytes: int = 0
    closed: bool = False

    def charge_body(self, body_bytes: int) -> None:
        """Charge a body of ``body_bytes`` (declared or read so far): its worst-case parse."""
        self.admission._charge(self, body_bytes * PARSE_BYTES_PER_BODY_BYTE, f"A request body of {body_bytes} bytes")

    def charge_response(self, values: int) -> None:
        """Add the memory of a response of ``values`` forecast values to what the ticket holds."""
        total = self.charged_bytes + values * RESPONSE_BYTES_PER_VALUE
        self.admission._charge(self, total, f"A response of {values} forecast values")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.admission._leave(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mb(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"
