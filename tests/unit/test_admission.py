"""A replica's admission (engine/admission.py): what it works on is bounded; past the bound requests wait in a
bounded queue, first come first served, and only past the queue's bounds is a request refused (clear and
retryable); small requests (a query, a caption) pass the queue and keep places of their own. Every wait here
is observed through the tasks' state after the event loop has run, never through the clock."""

import asyncio
import time

import pytest

from clipserve.engine.admission import Admission, Limits
from clipserve.engine.small_requests import SMALL
from clipserve.errors import DeadlineExceededError, OverloadedError


async def settle():
    """Let every task that can run, run (no clock: the event loop goes round a few times)."""
    for _ in range(5):
        await asyncio.sleep(0)


def run(scenario):
    asyncio.run(scenario())


def test_past_max_requests_a_large_request_waits_in_the_queue_and_takes_the_first_place_given_back():
    admission = Admission(Limits(max_requests=2, small_reserve=0))

    async def scenario():
        first, second = await admission.enter(8), await admission.enter(8)
        third = asyncio.create_task(admission.enter(8))
        await settle()
        assert not third.done() and (admission.requests, admission.queued, admission.refused) == (2, 1, 0)
        admission.leave(first)
        place = await asyncio.wait_for(third, 5)
        assert (admission.requests, admission.queued, admission.documents) == (2, 0, 16)
        admission.leave(second), admission.leave(place)
        assert (admission.requests, admission.documents) == (0, 0)

    run(scenario)


def test_the_queue_is_first_come_first_served():
    admission = Admission(Limits(max_requests=1, small_reserve=0))

    async def scenario():
        held = await admission.enter(8)
        order = []

        async def waiter(name):
            place = await admission.enter(8)
            order.append(name)
            return place

        tasks = []
        for name in 'abc':
            tasks.append(asyncio.create_task(waiter(name)))
            await settle()  # each is in line before the next arrives
        admission.leave(held)
        for task in tasks:
            admission.leave(await asyncio.wait_for(task, 5))
        assert order == ['a', 'b', 'c']

    run(scenario)


@pytest.mark.parametrize(
    'limits, documents, nbytes, limit',
    [
        (Limits(max_requests=1, small_reserve=0, queued_requests=2), 8, 0, 'max_queued_requests'),
        (Limits(max_requests=1, small_reserve=0, queued_documents=20), 15, 0, 'max_queued_documents'),
        (Limits(max_requests=1, small_reserve=0, queued_bytes=1000), 8, 600, 'max_queued_bytes'),
    ],
)
def test_past_the_queues_bounds_a_request_is_refused_naming_the_bound_and_when_to_retry(
    limits, documents, nbytes, limit
):
    admission = Admission(limits)

    async def scenario():
        held = await admission.enter(documents, nbytes)
        waiting = [
            asyncio.create_task(admission.enter(documents, nbytes))
            for _ in range(2 if limit == 'max_queued_requests' else 1)
        ]
        await settle()
        with pytest.raises(OverloadedError) as refused:
            await admission.enter(documents, nbytes)
        error = refused.value
        assert error.limit == limit and error.retryable and error.retry_after == 1.0
        assert f'{limit}=' in str(error) and 'retry after 1s' in str(error) and 'max_requests=1' in str(error)
        assert admission.refused == 1
        admission.leave(held)
        for task in waiting:
            admission.leave(await asyncio.wait_for(task, 5))  # the queued ones are served

    run(scenario)


def test_a_request_alone_in_the_queue_may_wait_whatever_its_size():
    admission = Admission(Limits(max_requests=1, small_reserve=0, queued_documents=10, queued_bytes=10))

    async def scenario():
        held = await admission.enter(8)
        big = asyncio.create_task(admission.enter(3000, 10_000_000))
        await settle()
        assert not big.done() and admission.queued == 1
        admission.leave(held)
        admission.leave(await asyncio.wait_for(big, 5))

    run(scenario)


def test_no_queue_refuses_at_once_as_before():
    admission = Admission(Limits(max_requests=1, small_reserve=0, queued_requests=0))

    async def scenario():
        await admission.enter(8)
        with pytest.raises(OverloadedError, match='max_queued_requests=0'):
            await admission.enter(8)

    run(scenario)


def test_small_requests_pass_the_queue_into_the_reserve():
    admission = Admission(Limits(max_requests=2, small_reserve=3))

    async def scenario():
        await admission.enter(8), await admission.enter(8)
        large = asyncio.create_task(admission.enter(SMALL.documents + 1))  # not small: waits
        await settle()
        taken = [await admission.enter(1), await admission.enter(SMALL.documents), await admission.enter(2)]
        assert [p.reserved for p in taken] == [True, True, True] and admission.small == 3
        fourth = asyncio.create_task(admission.enter(1))  # the reserve is full: it waits too, in line
        await settle()
        assert not large.done() and not fourth.done() and admission.queued == 2
        admission.leave(taken[0])  # a reserve place: for the small one, never the large one
        reserved = await asyncio.wait_for(fourth, 5)
        assert reserved.reserved and not large.done()

    run(scenario)


def test_past_max_documents_large_requests_wait_in_order_and_small_ones_never_wait_for_documents():
    admission = Admission(Limits(max_requests=8, max_documents=12, small_reserve=0))

    async def scenario():
        first = await admission.enter(6)
        second = asyncio.create_task(admission.enter(8))
        await settle()
        third = asyncio.create_task(admission.enter(5))  # would fit (6 + 5), but the second is ahead
        await settle()
        assert not second.done() and not third.done()
        small = await asyncio.wait_for(admission.enter(SMALL.documents), 5)  # passes both
        admission.leave(small)
        admission.leave(first)
        second_place = await asyncio.wait_for(second, 5)
        await settle()
        assert not third.done()  # 8 + 5 > 12
        admission.leave(second_place)
        admission.leave(await asyncio.wait_for(third, 5))
        assert (admission.requests, admission.documents, admission.refused) == (0, 0, 0)

    run(scenario)


def test_a_request_larger_than_max_documents_runs_alone():
    admission = Admission(Limits(max_requests=8, max_documents=10, small_reserve=0))

    async def scenario():
        huge = await admission.enter(50)
        small = await asyncio.wait_for(admission.enter(1), 5)  # small: never waits
        waiting = asyncio.create_task(admission.enter(20))
        await settle()
        assert not waiting.done()
        admission.leave(huge), admission.leave(small)
        await asyncio.wait_for(waiting, 5)  # larger than max_documents too: alone, it runs

    run(scenario)


def test_a_request_queued_past_its_deadline_fails_clearly_and_leaves_the_line():
    admission = Admission(Limits(max_requests=1, small_reserve=0))

    async def scenario():
        held = await admission.enter(8)
        with pytest.raises(DeadlineExceededError, match='waiting in the queue.*max_requests=1'):
            await admission.enter(8, deadline=time.monotonic())  # already due: no wait on the clock
        assert admission.queued == 0 and admission.queued_documents == 0
        later = asyncio.create_task(admission.enter(6))
        await settle()
        admission.leave(held)
        place = await asyncio.wait_for(later, 5)  # not behind the one gone
        assert (admission.requests, admission.documents) == (1, 6)
        admission.leave(place)

    run(scenario)


def test_a_cancelled_waiter_leaves_the_line_and_gives_back_what_it_was_granted():
    admission = Admission(Limits(max_requests=1, small_reserve=0))

    async def scenario():
        held = await admission.enter(8)
        gone = asyncio.create_task(admission.enter(8))
        await settle()
        gone.cancel()
        await settle()
        assert admission.queued == 0 and admission.queued_bytes == 0
        admission.leave(held)
        assert admission.requests == 0  # nothing granted to the cancelled one

    run(scenario)
