"""HTTP requests of one client address let through a few at a time (the gateway's max_stream_requests)."""

from __future__ import annotations

import time

from clipserve.engine.waiting_line import Line


class PeerShare:
    """At most `cap` HTTP requests of one client address past the gateway at once; the others wait, their
    bodies unread, in arrival order (engine/waiting_line.py). Jina's HTTP client (clip-client's too) sends
    `prefetch` requests at once (100), each a request of its own: without this one client would put them all
    on replicas that hold fewer, and be refused; the gateway's own bound (max_in_flight) still counts and
    refuses the waiting ones."""

    def __init__(self, cap: int):
        self.cap = int(cap)
        self._peers: dict[str, _Peer] = {}

    def share(self, peer: str, timeout: float | None = None) -> _PeerTurn:
        """`async with share(peer):` one turn of `peer`'s; TurnTimedOut when it has not come within `timeout`
        seconds (the client's own deadline)."""
        return _PeerTurn(self, peer, timeout)

    def waiting(self, peer: str) -> int:
        """Requests of `peer` waiting for a turn now."""
        state = self._peers.get(peer)
        return len(state.line) if state else 0


class TurnTimedOut(Exception):
    """A request's turn did not come before its deadline."""


class _Peer:
    def __init__(self):
        self.running = 0  # turns taken
        self.users = 0  # requests holding or waiting for a turn
        self.line = Line()


class _PeerTurn:
    def __init__(self, share: PeerShare, peer: str, timeout: float | None):
        self.share, self.peer, self.timeout = share, peer, timeout

    async def __aenter__(self):
        state = self.share._peers.setdefault(self.peer, _Peer())
        state.users += 1
        if state.running < self.share.cap and not state.line:
            state.running += 1
            return
        ticket = state.line.join(None, asynchronous=True)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            granted = await Line.wait_async(ticket, deadline)  # a turn given as time runs out is kept
        except BaseException:
            self._give_up(state, ticket)
            raise
        if not granted:
            self._give_up(state, ticket)
            raise TurnTimedOut()

    async def __aexit__(self, *exc):
        state = self.share._peers[self.peer]
        self._pass_on(state)
        self._forget(state)

    def _give_up(self, state: _Peer, ticket) -> None:
        if ticket.granted:
            self._pass_on(state)
        else:
            state.line.leave(ticket)
        self._forget(state)

    @staticmethod
    def _pass_on(state: _Peer) -> None:
        """A turn ends: the next waiter of this peer, if any, takes it."""
        state.running -= 1
        for ticket in state.line:
            state.running += 1
            state.line.grant(ticket)
            return

    def _forget(self, state: _Peer) -> None:
        state.users -= 1
        if not state.users:
            del self.share._peers[self.peer]
