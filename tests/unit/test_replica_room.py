"""The gateway's mirror of its replicas' admission (serving/gateway/replica_room.py): which executors it mirrors, what
it counts, when it refuses, and that it learns the replicas' bounds from the readiness probe (the refusals
themselves, on every protocol, are in tests/integration/test_gateway_admission.py)."""

import asyncio

import pytest

from clipserve.errors import OverloadedError
from clipserve.serving.gateway.readiness import FlowReadiness
from clipserve.serving.gateway.replica_room import ReplicaRoom, room_of


def report(max_requests=2, small=4, retry_after=1.0, shards=1, shard_id=0, executor='CLIPEncoder', queued=0):
    bound = {'max_requests': max_requests, 'small_documents': small, 'retry_after': retry_after, 'executor': executor}
    bound['max_queued_requests'] = queued
    return {'shard_id': shard_id, 'shards': shards, 'draining': False, 'admission': bound}


def test_an_executors_places_are_those_of_its_answering_replicas_together():
    room = room_of([[report(2)], [report(3, small=2, retry_after=2.0)]])
    assert (room.places, room.replicas, room.max_requests, room.small_documents, room.retry_after) == (5, 2, 2, 2, 2.0)
    assert room.executor == 'CLIPEncoder'


def test_a_replicas_queue_places_count_as_its_places():
    room = room_of([[report(2, queued=10)], [report(3, queued=20)]])
    assert (room.places, room.max_requests, room.max_queued_requests) == (35, 2, 10)


@pytest.mark.parametrize(
    'reports',
    [
        [],  # no replica answered
        [[{'shard_id': 0, 'shards': 1, 'draining': False}]],  # no bound reported (an older clipserve)
        [[]],  # not clipserve's executor
        [[report(shards=2), report(shards=2, shard_id=1)]],  # a head of shards
        [[report(shards=2)]],  # one shard
        [[report()], [{'shard_id': 0, 'shards': 1, 'admission': {'max_requests': 'many'}}]],
    ],
)
def test_executors_that_cannot_be_mirrored_are_not(reports):
    assert room_of(reports) is None


def mirrored(places=2, replicas=('a:1',), metrics=None) -> ReplicaRoom:
    room = ReplicaRoom(metrics)
    room.update({'clip': list(replicas), 'other': ['o:1']}, {a: [report(places)] for a in replicas})
    return room


def test_large_requests_are_counted_and_past_every_place_refused_naming_the_replicas_limit():
    class Metrics:
        seen = []

        def refused(self, protocol, limit):
            self.seen.append((protocol, limit))

        def executor_room(self, executor, places=None, held=None):
            pass

    room = mirrored(places=2, metrics=Metrics())
    assert room.enter('clip', 5) is True and room.enter('clip', 8) is True
    refusal = room.enter('clip', 5)
    assert isinstance(refusal, OverloadedError)
    assert refusal.limit == 'max_queued_requests' and refusal.retry_after == 1.0
    assert 'max_requests=2 and max_queued_requests=0' in str(refusal) and 'clip' in str(refusal)
    assert room.refused == 1 and Metrics.seen == [('all', 'max_queued_requests')]
    room.leave('clip')
    assert room.enter('clip', 5) is True  # a place given back is taken again


def test_small_requests_unread_ones_and_unmirrored_executors_pass_uncounted():
    room = mirrored(places=1)
    assert room.enter('clip', 5) is True
    assert room.enter('clip', 4) is None  # small: the replica's reserve is the replica's to judge
    assert room.enter('clip', None) is None  # documents not countable here: the replica judges
    assert room.enter('other', 50) is None  # reported no bound
    assert room.enter('unknown', 50) is None
    assert room.held['clip'] == 1


def test_every_answering_replica_adds_its_places_and_one_that_stops_answering_takes_them_away():
    room = mirrored(places=1, replicas=('a:1', 'a:2'))
    assert [room.enter('clip', 5) for _ in range(3)][:2] == [True, True]
    room.update({'clip': ['a:1', 'a:2']}, {'a:1': [report(1)]})  # a:2 no longer answers its probe
    room.leave('clip')
    room.leave('clip')
    assert room.enter('clip', 5) is True and isinstance(room.enter('clip', 5), OverloadedError)


def test_the_readiness_probe_hands_every_answering_replicas_reports_to_its_listeners():
    answers = {'a:1': [report(3)], 'a:2': RuntimeError('refused')}

    async def probe(address, timeout):
        answer = answers[address]
        if isinstance(answer, Exception):
            raise answer
        return answer

    readiness = FlowReadiness({'clip': ['a:1', 'a:2']}, probe=probe)
    room = ReplicaRoom()
    readiness.report_listeners.append(room.update)
    asyncio.run(readiness.check())
    assert room.rooms['clip'].places == 3 and room.rooms['clip'].replicas == 1
    answers['a:2'] = [report(3)]
    asyncio.run(readiness.check())
    assert room.rooms['clip'].places == 6
    answers['a:1'] = [dict(report(3), draining=True)]  # a draining replica takes no new requests
    asyncio.run(readiness.check())
    assert room.rooms['clip'].places == 3


def test_the_gateway_fills_only_its_share_of_each_queue_and_names_it():
    """A replica's queue of 1024 is there for clients behind Jina's own gateway; clipserve's gateway lets
    `max_queued_large` of them wait per replica, then refuses, naming that limit."""
    replicas = [[report(16, queued=1024)], [report(16, queued=1024)]]
    assert room_of(replicas).places == 2 * (16 + 1024)
    shared = room_of(replicas, queue_share=32)
    assert (shared.places, shared.limit, shared.max_queued_requests) == (2 * (16 + 32), 'max_queued_large', 32)
    assert room_of([[report(16, queued=8)]], queue_share=32).limit == 'max_queued_requests'  # the replica's is less
    room = ReplicaRoom(queue_share=0)
    room.update({'encoder': ['a']}, {'a': [report(16, queued=1024)]})
    assert all(room.enter('encoder', 8) is True for _ in range(16))
    refused = room.enter('encoder', 8)
    assert isinstance(refused, OverloadedError) and refused.limit == 'max_queued_large'
    assert 'max_queued_large=0' in str(refused)
