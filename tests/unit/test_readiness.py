"""The gateway's readiness verdict from the copies' answers, and the drain's grace period (the probes and
the drain themselves run in tests/integration/test_readiness.py against real Flows)."""

import asyncio

import grpc
import pytest

from clipserve.config.reading import read_setting
from clipserve.config.settings import EXECUTOR_SETTINGS
from clipserve.errors import InvalidParameterError
from clipserve.serving.gateway.readiness import FlowReadiness, grpc_addresses, judge_reports

GRACE = next(s for s in EXECUTOR_SETTINGS if s.name == 'shutdown_grace')


def test_deployment_addresses_in_both_of_jinas_shapes():
    assert grpc_addresses('{"a": ["127.0.0.1:1", "127.0.0.1:2"], "b": {"grpc": ["h:3"], "http": ["h:4"]}}') == {
        'a': ['127.0.0.1:1', '127.0.0.1:2'],
        'b': ['h:3'],
    }
    assert grpc_addresses('{}') == {}


@pytest.mark.parametrize(
    'reports, ready',
    [
        ([], True),  # an executor without the endpoint (not clipserve's): it answered, so it is up
        ([{'shard_id': 0, 'shards': 1, 'draining': False}], True),
        ([{'shard_id': 0, 'shards': 1, 'draining': True}], False),
        ([{'shard_id': 0, 'shards': 2, 'draining': False}], False),  # shard 1 did not answer
        ([{'shard_id': 1, 'shards': 2, 'draining': False}, {'shard_id': 0, 'shards': 2, 'draining': False}], True),
    ],
)
def test_every_shard_must_answer_and_none_may_drain(reports, ready):
    problems = judge_reports('clip_t', '127.0.0.1:1', reports)
    assert (not problems) == ready, problems


class Timeout(grpc.aio.AioRpcError):
    def __init__(self, code=grpc.StatusCode.DEADLINE_EXCEEDED):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata())


def test_a_ready_copy_that_is_only_slow_stays_ready_for_the_allowance_but_a_refusal_counts_at_once():
    answers = []

    async def probe(address, timeout):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    readiness = FlowReadiness({'clip_t': ['127.0.0.1:1']}, busy_allowance=30.0, probe=probe)
    up = [{'shard_id': 0, 'shards': 1, 'draining': False}]

    def verdict(answer):
        answers.append(answer)
        return asyncio.run(readiness.check()).ready

    assert not verdict(Timeout())  # never answered: a timeout is not "busy"
    assert verdict(up)
    assert verdict(Timeout())  # was ready a moment ago: busy
    assert not verdict(Timeout(grpc.StatusCode.UNAVAILABLE))  # refused: draining or gone
    assert not verdict(Timeout())  # and no longer counts as busy
    readiness.busy_allowance = 0.0
    assert verdict(up)
    assert not verdict(Timeout())  # past the allowance


@pytest.mark.parametrize(
    'configured, environ, seconds',
    [
        (None, {}, 30.0),
        (None, {'CLIPSERVE_SHUTDOWN_GRACE': '5'}, 5.0),
        (0, {'CLIPSERVE_SHUTDOWN_GRACE': '5'}, 0.0),
        ('2.5', {}, 2.5),
    ],
)
def test_shutdown_grace_from_argument_then_environment(configured, environ, seconds):
    assert read_setting(GRACE, configured, environ) == seconds


@pytest.mark.parametrize('bad', [-1, 'soon', float('nan')])
def test_a_bad_shutdown_grace_is_a_clear_error(bad):
    with pytest.raises(InvalidParameterError, match='shutdown_grace'):
        read_setting(GRACE, bad, {})
