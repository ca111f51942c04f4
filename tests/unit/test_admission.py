"""A replica's admission (engine/admission.py): requests in flight are bounded, and past the bound a clear
retryable refusal; documents past their bound wait for room, first come first served; small requests (a query,
a caption) keep places of their own, so large requests that fill a replica cannot refuse them."""

import asyncio
import time

import pytest

from clipserve.engine.admission import SMALL_REQUEST_DOCUMENTS, Admission, Limits
from clipserve.errors import DeadlineExceededError, OverloadedError


def test_past_max_requests_a_large_request_is_refused_naming_the_limit_and_when_to_retry():
    admission = Admission(Limits(max_requests=2, small_reserve=0))
    assert admission.enter(8) is False and admission.enter(8) is False
    with pytest.raises(OverloadedError) as refused:
        admission.enter(8)
    assert refused.value.limit == 'max_requests' and refused.value.retry_after == 1.0 and refused.value.retryable
    assert 'max_requests=2' in str(refused.value) and 'retry after 1s' in str(refused.value)
    admission.leave(8, ran=False)
    admission.enter(8)  # the place it left
    assert (admission.requests, admission.refused) == (2, 1)


def test_small_requests_take_the_reserve_when_large_ones_fill_the_replica():
    admission = Admission(Limits(max_requests=2, small_reserve=3))
    admission.enter(8), admission.enter(8)
    with pytest.raises(OverloadedError):
        admission.enter(SMALL_REQUEST_DOCUMENTS + 1)  # not small: refused
    taken = [admission.enter(1), admission.enter(SMALL_REQUEST_DOCUMENTS), admission.enter(2)]
    assert taken == [True, True, True] and admission.small == 3 and admission.requests == 5
    with pytest.raises(OverloadedError) as refused:
        admission.enter(1)  # the reserve is full too
    assert 'max_requests=2' in str(refused.value) and '3 small ones in its reserve of 3' in str(refused.value)
    admission.leave(1, reserved=True)
    assert admission.enter(1) is True  # the reserve place it left
    with pytest.raises(OverloadedError):
        admission.enter(8)  # a place of the reserve is never a large request's


def test_a_large_request_that_leaves_frees_an_ordinary_place_while_small_ones_hold_the_reserve():
    admission = Admission(Limits(max_requests=2, small_reserve=2))
    admission.enter(8), admission.enter(8)
    assert admission.enter(1) is True
    admission.leave(8)
    assert admission.enter(8) is False  # an ordinary place again
    with pytest.raises(OverloadedError):
        admission.enter(8)
    admission.leave(1, reserved=True)
    assert (admission.requests, admission.small) == (2, 0)


def test_a_small_request_below_the_limit_takes_an_ordinary_place():
    admission = Admission(Limits(max_requests=2, small_reserve=1))
    assert admission.enter(1) is False and admission.small == 0


def test_past_max_documents_a_request_waits_for_room_first_come_first_served_and_small_ones_never_wait():
    admission = Admission(Limits(max_requests=8, max_documents=10, small_reserve=0))

    async def scenario():
        admission.enter(6)
        await admission.documents_room(6, time.monotonic() + 5)
        admission.enter(8)
        admission.enter(5)
        second = asyncio.create_task(admission.documents_room(8, time.monotonic() + 5))
        await asyncio.sleep(0.05)
        third = asyncio.create_task(admission.documents_room(5, time.monotonic() + 5))
        await asyncio.sleep(0.05)
        assert not second.done() and not third.done()  # 6 + 8 and 6 + 5 are over 10: both wait
        admission.enter(SMALL_REQUEST_DOCUMENTS)
        await asyncio.wait_for(admission.documents_room(SMALL_REQUEST_DOCUMENTS, time.monotonic() + 5), 1)
        admission.leave(SMALL_REQUEST_DOCUMENTS)
        admission.leave(6)
        await asyncio.wait_for(second, 1)  # the first in line, though 5 would have fitted first
        await asyncio.sleep(0.05)
        assert not third.done()  # 8 + 5 > 10
        admission.leave(8)
        await asyncio.wait_for(third, 1)
        assert (admission.requests, admission.documents, admission.refused) == (1, 5, 0)

    asyncio.run(scenario())


def test_a_request_larger_than_max_documents_runs_alone():
    admission = Admission(Limits(max_requests=8, max_documents=10, small_reserve=0))

    async def scenario():
        admission.enter(50)
        await asyncio.wait_for(admission.documents_room(50, time.monotonic() + 5), 1)
        admission.enter(1)
        await asyncio.wait_for(admission.documents_room(1, time.monotonic() + 5), 1)  # small: never waits
        admission.enter(20)
        waiting = asyncio.create_task(admission.documents_room(20, time.monotonic() + 5))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        admission.leave(50), admission.leave(1)
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_a_request_waiting_for_room_past_its_deadline_fails_and_leaves_the_line():
    admission = Admission(Limits(max_requests=8, max_documents=10, small_reserve=0))

    async def scenario():
        admission.enter(10)
        await admission.documents_room(10, time.monotonic() + 5)
        admission.enter(8)
        with pytest.raises(DeadlineExceededError, match='max_documents=10'):
            await admission.documents_room(8, time.monotonic() + 0.1)
        admission.leave(8, ran=False)
        admission.enter(6)
        admission.leave(10)
        await asyncio.wait_for(admission.documents_room(6, time.monotonic() + 5), 1)  # not behind the one gone
        assert (admission.requests, admission.documents) == (1, 6)

    asyncio.run(scenario())
