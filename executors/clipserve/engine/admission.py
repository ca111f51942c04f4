"""Admission: what a replica works on is bounded; what it cannot work on yet waits in a bounded queue.

A replica works on at most `max_requests` requests and `max_documents` documents at once (its memory and
each admitted request's wait depend on it). Past that, a request waits in a queue, first come first served,
until a place and room for its documents come free. Clients keep many requests in flight (clip-client: 100;
a Jina client: its `prefetch`, 1000 by default behind Jina's own gateway), and refusing what a client sent
in good faith turns ordinary work into errors, since clip-client does not retry. The queue is bounded too,
by requests, documents and bytes (what the queued requests hold in memory): past those bounds, and only
then, a request is refused (OverloadedError: HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED). A queued
request whose deadline passes leaves the queue with DeadlineExceededError, uncomputed. A request alone
always runs, whatever its size (its memory is bounded by the pipeline's window, engine/pipeline.py).

Small requests (engine/small_requests.py: a search query, a caption to rank) pass the
queue: they never wait for documents' room, and `small_reserve` places beyond `max_requests` are theirs
alone, so a pipeline's queries are not stuck behind its own indexing; the scheduler then runs them in the
next forward pass (engine/scheduler.py).

Everything here runs on the replica's event loop (one thread): the queue is a waiting line
(engine/waiting_line.py) in arrival order, each request granted when a place is given back, never a poll.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from clipserve.engine.small_requests import SMALL, SmallRequests
from clipserve.engine.waiting_line import Line, Ticket
from clipserve.errors import DeadlineExceededError, OverloadedError

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    max_requests: int = 16
    max_documents: int = 4096
    retry_after: float = 1.0  # seconds a refused client is told to wait
    small_reserve: int = 64  # places beyond max_requests for small requests only
    queued_requests: int = 1024  # requests waiting for a place, at most
    queued_documents: int = 262_144  # documents of the waiting requests, at most
    queued_bytes: int = 512 * MiB  # content bytes of the waiting requests, at most
    small: SmallRequests = SMALL  # which requests pass the queue


@dataclass(eq=False)
class Place:
    """One admitted request's hold on the replica: give it back with Admission.leave."""

    documents: int
    reserved: bool = False  # a place of the small reserve


@dataclass(frozen=True)
class _Asks:
    documents: int
    nbytes: int
    small: bool


class Admission:
    """Counts what a replica works on and what waits; `enter` admits, queues or refuses, `leave` gives back."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.requests = 0  # admitted, in every kind of place
        self.documents = 0  # of the admitted requests
        self.small = 0  # places of the small reserve taken
        self.refused = 0
        self.admitted = 0
        self.queued_documents = 0
        self.queued_bytes = 0
        self.line = Line()  # the queue, in arrival order

    @property
    def queued(self) -> int:
        return len(self.line)

    async def enter(self, documents: int, nbytes: int = 0, deadline: float | None = None) -> Place:
        """A place for a request of `documents` documents (`nbytes` content bytes): at once when one is free
        and nothing larger waits before it, else after waiting in the queue; OverloadedError when the queue is
        full, DeadlineExceededError when `deadline` (time.monotonic()) passes first."""
        asks = _Asks(documents, nbytes, self.limits.small.is_small(documents))
        place = self._take(asks, queue_empty=not self.line)
        if place is not None:
            return place
        self._check_queue_room(asks)
        ticket = self.line.join(asks, asynchronous=True)
        self.queued_documents += documents
        self.queued_bytes += nbytes
        try:
            granted = await Line.wait_async(ticket, deadline)
        except BaseException:
            self._give_up(ticket)
            raise
        if granted:
            return ticket.value
        self._give_up(ticket)
        raise DeadlineExceededError(
            f'deadline exceeded waiting in the queue: {self.requests} requests and {self.documents} '
            f'documents in flight on this replica (max_requests={self.limits.max_requests}, '
            f'max_documents={self.limits.max_documents}), {self.queued} waiting; this request has '
            f'{documents} documents'
        )

    def leave(self, place: Place) -> None:
        """Give back a request's place and its documents' room; the next in the queue may take them."""
        self.requests -= 1
        self.documents -= place.documents
        self.small -= place.reserved
        self._grant()

    def _give_up(self, ticket: Ticket) -> None:
        """A request that stops waiting: a place granted meanwhile is given back, else it leaves the queue."""
        if ticket.granted:
            self.leave(ticket.value)
        else:
            self._uncount(ticket)
            self.line.leave(ticket)
            self._grant()  # a large request it held back may fit now

    # ---- the rules ------------------------------------------------------------------------------------

    def _take(self, waiter: _Asks, queue_empty: bool) -> Place | None:
        """Admit `waiter` now if the rules let it (see the module's docstring), or None."""
        ordinary = self.requests - self.small < self.limits.max_requests
        if waiter.small:
            if ordinary or self.small < self.limits.small_reserve:
                return self._admit(waiter.documents, reserved=not ordinary)
            return None
        fits = self.documents + waiter.documents <= self.limits.max_documents or not self.documents
        if queue_empty and ordinary and fits:
            return self._admit(waiter.documents, reserved=False)
        return None

    def _admit(self, documents: int, reserved: bool) -> Place:
        self.requests += 1
        self.documents += documents
        self.small += reserved
        self.admitted += 1
        return Place(documents, reserved)

    def _grant(self) -> None:
        """Places to the waiters that may take them: small ones wherever they are in line, large ones in order
        (the first large one that does not fit holds the others back)."""
        large_ahead = False
        for ticket in self.line:
            asks = ticket.want
            if not asks.small and large_ahead:
                continue
            place = self._take(asks, queue_empty=True)
            if place is None:
                large_ahead = large_ahead or not asks.small
                continue
            self._uncount(ticket)
            self.line.grant(ticket, place)

    def _uncount(self, ticket: Ticket) -> None:
        """`ticket` leaves the queue's counts (granted, or gone)."""
        self.queued_documents -= ticket.want.documents
        self.queued_bytes -= ticket.want.nbytes

    def _check_queue_room(self, waiter: _Asks) -> None:
        """OverloadedError naming the queue's bound that `waiter` would pass (a request alone in the queue
        passes none but the count: whatever its size, it may wait)."""
        limits = self.limits
        if len(self.line) >= limits.queued_requests:
            exceeded = ('max_queued_requests', f'{len(self.line)} requests waiting')
        elif self.line and self.queued_documents + waiter.documents > limits.queued_documents:
            exceeded = ('max_queued_documents', f'{self.queued_documents} documents waiting')
        elif self.line and self.queued_bytes + waiter.nbytes > limits.queued_bytes:
            exceeded = ('max_queued_bytes', f'{self.queued_bytes} bytes waiting')
        else:
            return
        limit, waiting = exceeded
        self.refused += 1
        bound = {
            'max_queued_requests': limits.queued_requests,
            'max_queued_documents': limits.queued_documents,
            'max_queued_bytes': limits.queued_bytes,
        }[limit]
        raise OverloadedError(
            f'overloaded: {self.requests} requests in flight on this replica (max_requests={limits.max_requests}) '
            f'and its queue is full: {waiting} ({limit}={bound}); retry after {limits.retry_after:g}s',
            limit,
            limits.retry_after,
        )


def deadline_after(seconds: float | None, maximum: float) -> float:
    """The time.monotonic() by which a request must be done: its own timeout, capped by the server's maximum."""
    limit = maximum if seconds is None else min(float(seconds), maximum)
    return time.monotonic() + limit
