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

import heapq
import itertools
import threading
import time

from clipserve.engine.small_requests import SmallRequests
from clipserve.errors import DeadlineExceededError


class Room:
    """`rows` of room; small newcomers (by `small`'s rule; None: no request is) may take `reserve` rows more."""

    def __init__(self, rows: int, reserve: int = 0, small: SmallRequests | None = None):
        self.capacity = rows
        self.free = rows  # below 0 while small newcomers hold part of the reserve
        self.reserve = reserve
        self.small = small
        self._changed = threading.Condition()
        self._waiting: list[tuple[int, int, int]] = []  # (rows had, rows asked, arrival): a heap, first goes next
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests waiting for room now (observable: metrics and tests read it instead of guessing by time)."""
        with self._changed:
            return len(self._waiting)

    def take(self, rows: int, deadline: float | None = None, had: int = 0) -> None:
        """Wait for `rows` rows of room (a minibatch larger than the whole room waits until it is empty);
        `had`: the rows this request took before, which puts it behind requests that had fewer."""
        need = min(rows, self.capacity)
        # what must be free: a small newcomer may dip into the reserve
        enough = need - self.reserve if self.small and self.small.is_newcomer(had, need) else need
        with self._changed:
            ticket = (had, need, next(self._arrivals))
            heapq.heappush(self._waiting, ticket)
            try:
                while self._waiting[0] != ticket or self.free < enough:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise DeadlineExceededError(
                            'the request waited past its deadline for room to decode its images'
                        )
                    self._changed.wait(left)
                heapq.heappop(self._waiting)
                self.free -= rows
            except BaseException:
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                raise
            finally:
                self._changed.notify_all()  # the next in line may be another waiter now

    def give(self, rows: int) -> None:
        if rows:
            with self._changed:
                self.free += rows
                self._changed.notify_all()
