"""A pass that is not full waits for the requests expected back (engine/expected_requests.py): clients answered a
moment ago send their next, and the scheduler merges them rather than settling into passes of half the clients.
The waits here end on arrivals (a submit), not on the clock: the bound on them is set far away, so a test that
passes did not depend on it."""

import time

import numpy as np

from clipserve.engine.expected_requests import SHARE_OF_PASS, ExpectedRequests
from clipserve.engine.scheduler import Scheduler, Task
from clipserve.engine.small_requests import SmallRequests

from .test_scheduler import Recorder, rows

TIMEOUT = 60  # a failure's bound, never reached when the code is right


def test_the_rule_waits_only_while_fewer_requests_wait_than_were_around_the_last_pass():
    rule = ExpectedRequests()
    assert rule.allowed('texts', 1, now=100.0) == 0.0  # no pass yet: nothing expected
    rule.after_pass('texts', requests_around=4, seconds=0.08, ended=100.0)
    assert rule.allowed('texts', 2, now=100.003) == SHARE_OF_PASS * 0.08
    assert rule.allowed('texts', 4, now=100.003) == 0.0 and rule.allowed('texts', 5, now=100.003) == 0.0
    assert rule.allowed('images', 1, now=100.003) == 0.0  # kinds are counted apart
    off = ExpectedRequests(share_of_pass=0.0)
    off.after_pass('texts', requests_around=4, seconds=0.08, ended=100.0)
    assert off.allowed('texts', 0, now=100.003) == 0.0


def test_a_request_that_comes_more_than_a_pass_after_the_last_one_ended_does_not_wait():
    rule = ExpectedRequests()
    rule.after_pass('texts', requests_around=4, seconds=0.08, ended=100.0)
    assert rule.allowed('texts', 1, now=100.08) == SHARE_OF_PASS * 0.08  # still on its way back
    assert rule.allowed('texts', 1, now=100.081) == 0.0  # the first after a pause


def busy_scheduler(share: float, short_for: SmallRequests | None = None) -> tuple[Scheduler, Recorder, list]:
    """A scheduler whose first pass (request 1) ran while requests 2 and 3 queued: three were around it."""
    model = Recorder()
    scheduler = Scheduler({'x': Task(model, batch=8, short_for=short_for)}, max_wait=0.001)
    scheduler.expected.share_of_pass = share
    model.gate.clear()
    first = scheduler.submit('x', rows(1, 2), request=1)
    assert model.entered.wait(TIMEOUT)
    queued = [scheduler.submit('x', rows(tag, 2), request=tag) for tag in (2, 3)]
    model.gate.set()
    np.testing.assert_array_equal(first.result(TIMEOUT), rows(10, 2))
    return scheduler, model, queued


def test_a_pass_waits_for_the_client_answered_a_moment_ago_and_merges_its_next_request():
    scheduler, model, queued = busy_scheduler(share=1e5)  # the bound: far beyond any arrival here
    assert scheduler.expected.expected['x'] == 3
    late = scheduler.submit('x', rows(4, 2), request=4)  # the first client's next request
    for tag, future in zip((2, 3, 4), [*queued, late]):
        np.testing.assert_array_equal(future.result(TIMEOUT), rows(10 * tag, 2))
    scheduler.close()
    assert model.batches == [[1, 1], [2, 2, 3, 3, 4, 4]]  # not [2, 2, 3, 3] then [4, 4]


def test_expected_requests_that_never_come_cost_one_bounded_wait_and_the_expectation_follows():
    scheduler, model, queued = busy_scheduler(share=1.0)  # at most one short pass's time
    for tag, future in zip((2, 3), queued):
        np.testing.assert_array_equal(future.result(TIMEOUT), rows(10 * tag, 2))
    assert model.batches == [[1, 1], [2, 2, 3, 3]]
    assert scheduler.expected.expected['x'] == 2  # the pass that waited in vain sets the next expectation
    scheduler.close()


def test_a_small_newcomers_short_pass_does_not_wait_for_expected_requests():
    # images on a CPU: a pass led by a small request that has had nothing is short and runs next (a person waits)
    # three were around the first pass, two wait; a wait would last far beyond TIMEOUT (the bound: 1e7 passes)
    scheduler, model, queued = busy_scheduler(share=1e7, short_for=SmallRequests(documents=4))
    for tag, future in zip((2, 3), queued):
        np.testing.assert_array_equal(future.result(TIMEOUT), rows(10 * tag, 2))
    scheduler.close()
    assert model.batches == [[1, 1], [2, 2, 3, 3]]


def test_a_lone_client_never_waits():
    model = Recorder()
    scheduler = Scheduler({'x': Task(model, batch=8)}, max_wait=0.001)
    scheduler.expected.share_of_pass = 1e5
    for tag in range(1, 6):  # each request sent when the last is answered
        np.testing.assert_array_equal(
            scheduler.submit('x', rows(tag, 2), request=tag).result(TIMEOUT), rows(10 * tag, 2)
        )
        assert scheduler.expected.expected['x'] == 1 and scheduler.expected.allowed('x', 1, time.monotonic()) == 0.0
    scheduler.close()


def test_without_batch_waits_nothing_waits_for_expected_requests():
    for scheduler in (
        Scheduler({'x': Task(Recorder(), batch=8)}, max_wait=0.0),
        Scheduler({'x': Task(Recorder(), 8)}),
    ):
        assert scheduler.expected.share_of_pass == 0.0  # batch_wait_ms 0, or batching off
        scheduler.close()
