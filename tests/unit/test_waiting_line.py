"""engine/waiting_line.py: the one way clipserve waits for a turn (admission, decoding room, a client address's
share of the gateway): order, grants, deadlines and cancellation on both faces, and observing the line."""

import asyncio
import threading
import time

import pytest

from clipserve.engine.waiting_line import Line


def test_waiters_are_in_key_order_then_arrival_and_a_grant_wakes_a_thread():
    line = Line()
    late = line.join('late', key=(2,))
    first = line.join('first', key=(1,))
    second = line.join('second', key=(1,))
    assert [t.want for t in line] == ['first', 'second', 'late'] and len(line) == 3
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(Line.wait(second, time.monotonic() + 60)))
    waiter.start()
    line.grant(second, 'a place')
    waiter.join(60)
    assert woke == [True] and second.granted and second.value == 'a place'
    assert [t.want for t in line] == ['first', 'late'] and not first.granted and not late.granted


def test_a_thread_past_its_deadline_gets_false_and_its_owner_removes_it():
    line = Line()
    ticket = line.join('x')
    assert Line.wait(ticket, time.monotonic() + 0.01) is False and not ticket.granted
    line.leave(ticket)
    line.leave(ticket)  # leaving twice is harmless
    assert len(line) == 0


def test_the_async_face_grants_times_out_and_passes_cancellation():
    async def scenario():
        line = Line()
        granted, expired, cancelled = (line.join(n, asynchronous=True) for n in ('granted', 'expired', 'cancelled'))
        asyncio.get_running_loop().call_soon(line.grant, granted, 7)
        assert await Line.wait_async(granted, time.monotonic() + 60) and granted.value == 7
        assert await Line.wait_async(expired, time.monotonic() + 0.01) is False
        task = asyncio.ensure_future(Line.wait_async(cancelled))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not cancelled.granted and len(line) == 2  # the owner decides who leaves

    asyncio.run(scenario())


def test_a_grant_that_comes_as_the_deadline_passes_stands():
    async def scenario():
        line = Line()
        ticket = line.join('x', asynchronous=True)
        line.grant(ticket, 'kept')
        assert await Line.wait_async(ticket, time.monotonic() - 1) and ticket.value == 'kept'

    asyncio.run(scenario())


def test_waiting_is_observable_without_the_clock():
    line = Line()
    joined = threading.Thread(target=lambda: [line.join(i) for i in range(3)])
    joined.start()
    assert line.wait_until(lambda seen: len(seen) == 3, timeout=60)
    joined.join(60)
    assert not line.wait_until(lambda seen: len(seen) == 4, timeout=0.01)
