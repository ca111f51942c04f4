"""Admission: a replica holds a bounded number of requests and documents; past the bound, a clear refusal.

A server that accepts everything under overload queues without end: latency grows with the queue,
memory with it, and the requests that time out on the client's side are still computed. Refusing at
once what would exceed the bound keeps both flat and tells the client to retry (OverloadedError: HTTP
429 with Retry-After, gRPC RESOURCE_EXHAUSTED). A request with more documents than the document bound
is still admitted when it would be alone: the bound limits what runs together, never what one
request may hold (its memory is bounded by the pipeline's window, engine/pipeline.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from clipserve.errors import OverloadedError


@dataclass(frozen=True)
class Limits:
    max_requests: int = 64
    max_documents: int = 4096
    retry_after: float = 1.0  # seconds a refused client is told to wait


class Admission:
    """Counts what a replica holds; `enter` admits or refuses, `leave` gives the room back."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self._lock = threading.Lock()
        self.requests = 0
        self.documents = 0
        self.refused = 0
        self.admitted = 0

    def enter(self, documents: int) -> None:
        """Admit a request of `documents` documents, or raise OverloadedError naming the limit."""
        with self._lock:
            if self.requests >= self.limits.max_requests:
                self.refused += 1
                raise OverloadedError(
                    f'overloaded: {self.requests} requests in flight on this replica, its limit '
                    f'(max_requests={self.limits.max_requests}); retry after {self.limits.retry_after:g}s',
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
            self.admitted += 1

    def leave(self, documents: int) -> None:
        with self._lock:
            self.requests -= 1
            self.documents -= documents


def deadline_after(seconds: float | None, maximum: float) -> float:
    """The time.monotonic() by which a request must be done: its own timeout, capped by the server's maximum."""
    limit = maximum if seconds is None else min(float(seconds), maximum)
    return time.monotonic() + limit
