"""The gateway's mirror of its replicas' admission: a request every replica would refuse is refused here.

Under overload, once its queue is full, a replica refuses large requests (engine/admission.py). Refused by a
replica, each one still crossed the gateway twice and the replica once: sent on, received and parsed there,
answered with its documents, relayed back; work on the cores the model needs. So each replica reports its
bound (its places and its queue) in its readiness report (jina/endpoints.py), and the gateway counts the large
requests it has sent to each executor and not yet had answered. When they fill every replica's places and
the gateway's share of each queue (its `max_queued_large`: a queue of 1024 large requests, there for clients
behind Jina's own gateway, holds gigabytes under sustained overload), the gateway answers the next large
request itself with an OverloadedError like the replica's: the same answer, on every protocol, without the
executor.

Past its share of the queues, the mirror refuses only what the replicas would. It counts only large
requests (more root documents than a replica's small bound; with their matches a request may be larger,
never smaller) and only its own (other gateways' and direct callers' requests make the replicas fuller, not
emptier), so every request it lets through meets the replica's own admission as before. Small requests
always go on: the replicas' reserve is theirs to judge. Sharded executors, executors that report no bound
(not clipserve's) and replicas that do not answer the readiness probe are not mirrored.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from clipserve.errors import OverloadedError
from clipserve.serving.gateway.metrics import GatewayMetrics
from clipserve.serving.jina.endpoints import ADMISSION_TAG


@dataclass(frozen=True)
class Room:
    """The places an executor's answering replicas hold for large requests, together."""

    places: int  # places and queue places, all replicas together
    replicas: int
    max_requests: int  # the smallest replica's, for the message
    max_queued_requests: int  # the smallest replica's, for the message
    small_documents: int  # a request of at most this many documents is small on every replica
    retry_after: float
    executor: str  # the executor's class, as its own errors name it
    limit: str = 'max_queued_requests'  # which bound the queue places are: the replicas' or the gateway's share


def room_of(reports_by_address: list[list[dict]], queue_share: int | None = None) -> Room | None:
    """One executor's Room from the readiness reports of its replicas that answered; None when it cannot be
    mirrored (no replica answered, a replica is sharded or reports no bound). `queue_share`: the queue places
    per replica this gateway fills (the gateway's max_queued_large), else the whole queue."""
    bounds = []
    for reports in reports_by_address:
        if len(reports) != 1 or int(reports[0].get('shards', 1) or 1) != 1:
            return None  # a head of shards, or a shard: its places are not one replica's
        bound = reports[0].get(ADMISSION_TAG)
        if not isinstance(bound, dict):
            return None
        try:
            bounds.append(
                (
                    int(bound['max_requests']),
                    int(bound['small_documents']),
                    float(bound['retry_after']),
                    str(bound.get('executor') or ''),
                    int(bound.get('max_queued_requests', 0)),
                )
            )
        except (KeyError, TypeError, ValueError):
            return None
    if not bounds:
        return None
    queued = [b[4] if queue_share is None else min(b[4], queue_share) for b in bounds]
    shared = queue_share is not None and queue_share < min(b[4] for b in bounds)
    return Room(
        places=sum(b[0] for b in bounds) + sum(queued),
        replicas=len(bounds),
        max_requests=min(b[0] for b in bounds),
        max_queued_requests=min(queued),
        small_documents=min(b[1] for b in bounds),
        retry_after=max(b[2] for b in bounds),
        executor=bounds[0][3],
        limit='max_queued_large' if shared else 'max_queued_requests',
    )


class ReplicaRoom:
    """Large requests this gateway has in flight per executor, against the places its replicas report.

    `enter` says what to do with one request on its way to an executor: None (send it, uncounted), True (send
    it, counted: call `leave` when it is answered) or an OverloadedError to answer it with. One event loop
    serves every protocol: no lock."""

    def __init__(self, metrics=None, queue_share: int | None = None):
        self.queue_share = queue_share  # the gateway's max_queued_large
        self.rooms: dict[str, Room] = {}
        self.held: collections.Counter[str] = collections.Counter()
        self.refused = 0
        self.metrics = metrics or GatewayMetrics()  # no registry: a no-op

    def update(self, deployments: dict[str, list[str]], reports: dict[str, list[dict]]) -> None:
        """The rooms from the latest readiness reports (address -> reports, answering addresses only)."""
        rooms = {}
        for name, addresses in deployments.items():
            room = room_of([reports[a] for a in addresses if a in reports], self.queue_share)
            if room is not None:
                rooms[name] = room
            self.metrics.executor_room(name, places=room.places if room is not None else 0)
        self.rooms = rooms

    def enter(self, deployment: str, roots: int | None) -> bool | None | OverloadedError:
        room = self.rooms.get(deployment)
        if room is None or roots is None or roots <= room.small_documents:
            return None
        held = self.held[deployment]
        if held >= room.places:
            self.refused += 1
            self.metrics.refused('all', room.limit)
            limit = room.limit
            return OverloadedError(
                f'overloaded: {held} requests in flight on {deployment} ({room.replicas} replica(s)), its limit '
                f'(max_requests={room.max_requests} and {limit}={room.max_queued_requests} per replica); retry '
                f'after {room.retry_after:g}s',
                limit,
                room.retry_after,
            )
        self.held[deployment] = held + 1
        self.metrics.executor_room(deployment, held=held + 1)
        return True

    def leave(self, deployment: str) -> None:
        self.held[deployment] -= 1
        self.metrics.executor_room(deployment, held=self.held[deployment])
