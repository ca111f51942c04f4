"""The small-request policy, in one place: which requests are small, and which are small newcomers.

A small request (a search query, a caption to rank, a query image) is the one a person waits on; large ones
(indexing, bulk) can wait a little longer. Three stages let small ones past large ones, each by this one
rule: admission (a reserve of places, no wait for documents' room: admission.py), room to decode images (a
small newcomer may take rows beyond the room: room.py), and the forward pass (on a CPU, a pass led by small
newcomers is short and theirs first: scheduler.py). The gateway mirrors the threshold from each replica's
readiness report (serving/gateway/replica_room.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmallRequests:
    documents: int = 4  # a request of at most this many documents (roots and matches), or rows, is small

    def is_small(self, documents: int) -> bool:
        return documents <= self.documents

    def is_newcomer(self, had: int, waiting: int) -> bool:
        """A small request that has had nothing yet: `had` rows so far, `waiting` rows asked for."""
        return had == 0 and waiting <= self.documents


SMALL = SmallRequests()
