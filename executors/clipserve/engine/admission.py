"""Admission: a replica holds a bounded number of requests and documents; past the bound, a clear refusal.

A server that accepts everything under overload queues without end: latency grows with the queue,
memory with it, and the requests that time out on the client's side are still computed. Refusing at
once what would exceed the bound keeps both flat and tells the client to retry (OverloadedError: HTTP
429 with Retry-After, gRPC RESOURCE_EXHAUSTED). A request with more documents than the document bound
is still admitted when it would be alone: the bound limits what runs together, never what one
request may hold (its memory is bounded by the pipeline's window, engine/pipeline.py).

Small requests have places of their own: `small_reserve` places beyond `max_requests` that only a
request of at most SMALL_REQUEST_DOCUMENTS documents (a search query, a caption to rank) may take. Under
overload every place a large request leaves is taken by the next large one at once, so without them a
pipeline's queries would be refused for as long as its indexing (or another client's) keeps the replica
full; the scheduler then runs them in the next forward pass (engine/scheduler.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from clipserve.errors import OverloadedError

#: a request of at most this many documents (roots and matches) may take a place of the small reserve
SMALL_REQUEST_DOCUMENTS = 4


@dataclass(frozen=True)
class Limits:
    max_requests: int = 64
    max_documents: int = 4096
    retry_after: float = 1.0  # seconds a refused client is told to wait
    small_reserve: int = 16  # places beyond max_requests for small requests only


class Admission:
    """Counts what a replica holds; `enter` admits or refuses, `leave` gives the room back."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self._lock = threading.Lock()
        self.requests = 0
        self.documents = 0
        self.refused = 0
        self.admitted = 0
        self.small = 0  # places of the small reserve taken

    def enter(self, documents: int) -> bool:
        """Admit a request of `documents` documents, or raise OverloadedError naming the limit. Returns True
        when it took a place of the small reserve: give that to `leave`."""
        with self._lock:
            reserved = self.requests - self.small >= self.limits.max_requests
            if reserved and (documents > SMALL_REQUEST_DOCUMENTS or self.small >= self.limits.small_reserve):
                self.refused += 1
                small = f', and {self.small} small ones in its reserve of {self.limits.small_reserve}'
                raise OverloadedError(
                    f'overloaded: {self.requests - self.small} requests in flight on this replica, its limit '
                    f'(max_requests={self.limits.max_requests}){small if self.small else ""}; '
                    f'retry after {self.limits.retry_after:g}s',
                    'max_requests',
                    self.limits.retry_after,
                )
            if self.requests and self.documents + documents > self.limits.max_documents:
                self.refused += 1
                raise OverloadedError(
                    f'overloaded: {self.documents} documents in flight on this replica and this request has '
                    f'{documents}, over its limit (max_documents={self.limits.max_documents}); '
                    f'retry after {self.limits.retry_after:g}s',
                    'max_documents',
                    self.limits.retry_after,
                )
            self.requests += 1
            self.documents += documents
            self.small += reserved
            self.admitted += 1
            return reserved

    def leave(self, documents: int, reserved: bool = False) -> None:
        with self._lock:
            self.requests -= 1
            self.documents -= documents
            self.small -= reserved


def deadline_after(seconds: float | None, maximum: float) -> float:
    """The time.monotonic() by which a request must be done: its own timeout, capped by the server's maximum."""
    limit = maximum if seconds is None else min(float(seconds), maximum)
    return time.monotonic() + limit
