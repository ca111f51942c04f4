"""Room for decoded images: how many rows of pixels may wait for the model at once, all requests together.

A request takes room before it decodes a minibatch and gives each image's row back once the model has
run that image (or the image failed), so under any load decoded pixels in memory stay bounded. When room is short, who gets it
next decides who waits: not the first to ask (a small request would wait behind every large one admitted
before it, each holding its place), nor whichever thread wakes first, but the waiter whose request has had
the least room so far, then the one asking for fewer rows, then the earliest. A newcomer's first minibatch
so goes ahead of the later minibatches of large requests, and a one-image request ahead of an eight-image
one. And a small newcomer (it has had no room, and asks for at most `small` rows: a query image) does not
wait at all: it may take up to `reserve` rows beyond the room, so it waits only for the forward pass
running now (engine/scheduler.py). Large requests still progress: the requests a replica holds are
bounded (engine/admission.py).
"""

from __future__ import annotations

import threading

from clipserve.engine.small_requests import SmallRequests
from clipserve.engine.waiting_line import Line
from clipserve.errors import DeadlineExceededError


class Room:
    """`rows` of room; small newcomers (by `small`'s rule; None: no request is) may take `reserve` rows more."""

    def __init__(self, rows: int, reserve: int = 0, small: SmallRequests | None = None):
        self.capacity = rows
        self.free = rows  # below 0 while small newcomers hold part of the reserve
        self.reserve = reserve
        self.small = small
        self._lock = threading.Lock()
        self.line = Line()  # ordered by (rows had, rows asked), then arrival: the first goes next

    @property
    def waiting(self) -> int:
        """Requests waiting for room now (observable: metrics and tests read it instead of guessing by time)."""
        return len(self.line)

    def take(self, rows: int, deadline: float | None = None, had: int = 0) -> None:
        """Wait for `rows` rows of room (a minibatch larger than the whole room waits until it is empty);
        `had`: the rows this request took before, which puts it behind requests that had fewer."""
        need = min(rows, self.capacity)
        # what must be free: a small newcomer may dip into the reserve
        enough = need - self.reserve if self.small and self.small.is_newcomer(had, need) else need
        with self._lock:
            ticket = self.line.join((rows, enough), key=(had, need))
            self._grant()
        if Line.wait(ticket, deadline):
            return
        with self._lock:
            if ticket.granted:  # granted as its deadline passed: the room is its
                return
            self.line.leave(ticket)
            self._grant()  # those behind it may go now
        raise DeadlineExceededError('the request waited past its deadline for room to decode its images')

    def give(self, rows: int) -> None:
        if rows:
            with self._lock:
                self.free += rows
                self._grant()

    def _grant(self) -> None:
        """Room to the waiters in order, while the first of them fits (lock held)."""
        for ticket in self.line:
            rows, enough = ticket.want
            if self.free < enough:
                return
            self.free -= rows
            self.line.grant(ticket)
