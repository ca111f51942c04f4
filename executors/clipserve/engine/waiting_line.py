"""One way to wait for a turn: a line of waiters that its owner grants, in its order, by its rule.

Wherever work waits for room in clipserve (admission to a replica: admission.py; room to decode images:
room.py; a client address's share of the gateway: serving/gateway/peer_share.py) there is a line: a waiter
joins with what it asks for, the owner walks the line in order and grants what its rule allows, and a
granted waiter goes on. What differs is the rule and the order, which stay with each owner; the waiting is
done here, once, with a face for threads and one for the event loop, each with a deadline. The owner holds
its own lock (or its event loop) around joining, granting and leaving; a waiter waits outside it, and after a
wait that ended without a grant the owner decides under its lock whether the grant came after all (then it
stands) or the waiter leaves the line.

A line is observable: `len(line)` is who waits now, and `wait_until` blocks until a condition on it holds
(checked at every change), so metrics and tests see the waiting instead of guessing it by the clock.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import threading
import time
from typing import Any, Callable


class Ticket:
    """One waiter's place: `want` is what it asks for; `granted` and `value` are set by the owner's grant."""

    __slots__ = ('want', 'order', 'granted', 'value', '_event', '_future')

    def __init__(self, want: Any, order: tuple, asynchronous: bool):
        self.want = want
        self.order = order
        self.granted = False
        self.value: Any = None
        self._event = None if asynchronous else threading.Event()
        self._future = asyncio.get_running_loop().create_future() if asynchronous else None

    def __lt__(self, other: Ticket) -> bool:
        return self.order < other.order


class Line:
    """Waiters in order of `key` (then arrival); the owner grants them with `grant`."""

    def __init__(self):
        self._tickets: list[Ticket] = []
        self._arrivals = itertools.count()
        self._changed = threading.Condition()

    def __len__(self) -> int:
        return len(self._tickets)

    def __iter__(self):
        """The waiters in order (a copy: the owner may grant while walking it)."""
        return iter(list(self._tickets))

    def join(self, want: Any, key: tuple = (), asynchronous: bool = False) -> Ticket:
        """A new waiter asking for `want`, placed by `key` (smaller first), then by arrival. An asynchronous
        ticket is waited on with `wait_async` on the running event loop, a synchronous one with `wait`."""
        ticket = Ticket(want, (*key, next(self._arrivals)), asynchronous)
        bisect.insort(self._tickets, ticket)
        self._notify()
        return ticket

    def grant(self, ticket: Ticket, value: Any = None) -> None:
        """`ticket` leaves the line with its turn (and `value`, e.g. the place it was given)."""
        self._tickets.remove(ticket)
        ticket.granted, ticket.value = True, value
        if ticket._future is not None:
            if not ticket._future.done():
                ticket._future.set_result(value)
        else:
            ticket._event.set()
        self._notify()

    def leave(self, ticket: Ticket) -> None:
        """`ticket` gives up its place (its deadline passed, its caller went away)."""
        if ticket in self._tickets:
            self._tickets.remove(ticket)
            self._notify()

    @staticmethod
    def wait(ticket: Ticket, deadline: float | None = None) -> bool:
        """Block this thread until `ticket` is granted (True) or `deadline` (time.monotonic()) passes (False)."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        return ticket._event.wait(timeout)

    @staticmethod
    async def wait_async(ticket: Ticket, deadline: float | None = None) -> bool:
        """`wait` on the event loop; a cancelled caller's CancelledError passes through."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(ticket._future), timeout)
        except asyncio.TimeoutError:
            return ticket.granted
        return True

    def wait_until(self, condition: Callable[[Line], bool], timeout: float | None = None) -> bool:
        """Block until `condition(line)` holds (checked at every change); False after `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
