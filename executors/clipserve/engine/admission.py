"""Admission: a replica holds a bounded number of requests and documents; past the bound, a clear refusal.

A server that accepts everything under overload queues without end: latency grows with the queue,
memory with it, and the requests that time out on the client's side are still computed. Refusing at
once what would exceed the bound keeps both flat and tells the client to retry (OverloadedError: HTTP
429 with Retry-After, gRPC RESOURCE_EXHAUSTED). A request with more documents than the document bound
is not refused: it waits, holding its place, for the documents before it to leave (first come, first
served; past its deadline it fails as any request does). One client keeps many requests in flight at once
(clip-client: 100, of `batch_size` documents each; the gateway lets a replica see at most
`max_stream_requests` of one stream), so refusing on documents would refuse one well-behaved client with large
batches; the requests a replica holds, and so its memory, stay bounded by max_requests. A request alone
always runs, whatever its size (its memory is bounded by the pipeline's window, engine/pipeline.py), and
small requests never wait for documents.

Small requests have places of their own: `small_reserve` places beyond `max_requests` that only a
request of at most SMALL_REQUEST_DOCUMENTS documents (a search query, a caption to rank) may take. Under
overload every place a large request leaves is taken by the next large one at once, so without them a
pipeline's queries would be refused for as long as its indexing (or another client's) keeps the replica
full; the scheduler then runs them in the next forward pass (engine/scheduler.py).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass

from clipserve.errors import DeadlineExceededError, OverloadedError

#: a request of at most this many documents (roots and matches) may take a place of the small reserve
SMALL_REQUEST_DOCUMENTS = 4


@dataclass(frozen=True)
class Limits:
    max_requests: int = 16
    max_documents: int = 4096
    retry_after: float = 1.0  # seconds a refused client is told to wait
    small_reserve: int = 64  # places beyond max_requests for small requests only


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
        self._waiting: list[int] = []  # tickets of requests waiting for documents' room, first in line first
        self._tickets = itertools.count()

    def enter(self, documents: int) -> bool:
        """Admit a request of `documents` documents, or raise OverloadedError naming the limit. Returns True
        when it took a place of the small reserve: give that to `leave`. Its documents then wait for room
        (`documents_room`)."""
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
            self.requests += 1
            self.small += reserved
            self.admitted += 1
            return reserved

    def take_documents(self, documents: int, ticket: int | None = None) -> bool:
        """Room for an admitted request's documents now: below max_documents, or nothing else running, or a
        small request; a request that waits holds `ticket` (its place in line) and only the first in line may
        take room."""
        with self._lock:
            first = not self._waiting or self._waiting[0] == ticket
            fits = self.documents + documents <= self.limits.max_documents or not self.documents
            if documents <= SMALL_REQUEST_DOCUMENTS or (first and fits):
                self.documents += documents
                if ticket is not None and self._waiting and self._waiting[0] == ticket:
                    self._waiting.pop(0)
                return True
            if ticket is None:
                return False
            if ticket not in self._waiting:
                self._waiting.append(ticket)
            return False

    async def documents_room(self, documents: int, deadline: float, poll: float = 0.01) -> None:
        """Wait, first come first served, until the request's documents fit (see take_documents); past
        `deadline` (time.monotonic()) raise DeadlineExceededError, giving up its place in line."""
        if self.take_documents(documents):
            return
        ticket = next(self._tickets)
        try:
            while not self.take_documents(documents, ticket):
                if time.monotonic() >= deadline:
                    raise DeadlineExceededError(
                        f'deadline exceeded waiting for room: {self.documents} documents in flight on this '
                        f'replica and this request has {documents} (max_documents={self.limits.max_documents})'
                    )
                await asyncio.sleep(poll)
        except BaseException:
            with self._lock:
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
            raise

    def leave(self, documents: int, reserved: bool = False, ran: bool = True) -> None:
        """Give back a request's place (and, when its documents had room, `ran`, their room)."""
        with self._lock:
            self.requests -= 1
            self.documents -= documents if ran else 0
            self.small -= reserved


def deadline_after(seconds: float | None, maximum: float) -> float:
    """The time.monotonic() by which a request must be done: its own timeout, capped by the server's maximum."""
    limit = maximum if seconds is None else min(float(seconds), maximum)
    return time.monotonic() + limit
