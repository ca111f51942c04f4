"""HTTP requests of one client address let through a few at a time (the gateway's max_stream_requests)."""

from __future__ import annotations

import asyncio


class PeerShare:
    """At most `cap` HTTP requests of one client address past the gateway at once; the others wait, their
    bodies unread. Jina's HTTP client (clip-client's too) sends `prefetch` requests at once (100), each a
    request of its own: without this one client would put them all on replicas that hold fewer, and be
    refused; the gateway's own bound (max_in_flight) still counts and refuses the waiting ones."""

    def __init__(self, cap: int):
        self.cap = int(cap)
        self._peers: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    def share(self, peer: str, timeout: float | None = None) -> _PeerTurn:
        """`async with share(peer):` one turn of `peer`'s; TurnTimedOut when it has not come within `timeout`
        seconds (the client's own deadline)."""
        return _PeerTurn(self, peer, timeout)


class TurnTimedOut(Exception):
    """A request's turn did not come before its deadline."""


class _PeerTurn:
    def __init__(self, share: PeerShare, peer: str, timeout: float | None):
        self.share, self.peer, self.timeout = share, peer, timeout

    async def __aenter__(self):
        share = self.share
        share._users[self.peer] = share._users.get(self.peer, 0) + 1
        semaphore = share._peers.setdefault(self.peer, asyncio.Semaphore(share.cap))
        try:
            await asyncio.wait_for(semaphore.acquire(), self.timeout)  # a turn taken as time runs out is kept
        except asyncio.TimeoutError:
            self._forget()
            raise TurnTimedOut() from None
        except BaseException:
            self._forget()
            raise

    async def __aexit__(self, *exc):
        self.share._peers[self.peer].release()
        self._forget()

    def _forget(self):
        share = self.share
        share._users[self.peer] -= 1
        if not share._users[self.peer]:
            del share._users[self.peer], share._peers[self.peer]
