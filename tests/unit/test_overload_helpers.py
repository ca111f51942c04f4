"""The overload benchmark's helpers without a Flow: the open loop's schedule and sending, how a failed request
is classified, percentiles, goodput, and resident memory sampled over time (benchmarks/overload_helpers.py)."""

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.overload_helpers import (
    ERROR,
    LOST,
    OK,
    REFUSED,
    UNCLEAR,
    Arrival,
    Outcome,
    RssSampler,
    arrivals,
    classify,
    memory_growth,
    open_loop,
    percentile,
    small_arrivals,
    summarize,
    vm_rss_mb,
)


def test_a_fixed_schedule_is_evenly_spaced_and_every_prefix_has_the_mix():
    schedule = arrivals(large_rate=4.0, seconds=10.0, small_fraction=0.2, poisson=False)
    assert len(schedule) == 50  # 4 large/s are 80 % of 5 requests/s
    gaps = np.diff([a.at for a in schedule])
    assert gaps == pytest.approx(np.full(49, 0.2))
    assert schedule[0].at == 0 and schedule[-1].at < 10.0
    kinds = [a.kind for a in schedule]
    for n in (5, 10, 25, 50):
        assert sum(k != 'large' for k in kinds[:n]) == n // 5
    small = [k for k in kinds if k != 'large']
    assert small == ['text', 'image'] * 5  # they take turns


def test_a_poisson_schedule_has_the_rate_and_mix_and_is_reproducible():
    schedule = arrivals(large_rate=40.0, seconds=100.0, small_fraction=0.2, seed=3)
    assert schedule == arrivals(large_rate=40.0, seconds=100.0, small_fraction=0.2, seed=3)
    assert schedule != arrivals(large_rate=40.0, seconds=100.0, small_fraction=0.2, seed=4)
    times = [a.at for a in schedule]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 100.0
    assert len(schedule) == pytest.approx(5000, rel=0.05)
    kinds = [a.kind for a in schedule]
    assert kinds.count('large') / len(kinds) == pytest.approx(0.8, abs=0.02)
    assert kinds.count('text') == pytest.approx(kinds.count('image'), rel=0.15)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential gaps


def test_no_schedule_for_no_rate_and_a_bad_mix_is_refused():
    assert arrivals(0.0, 10.0) == [] and arrivals(1.0, 0.0) == []
    with pytest.raises(ValueError, match='small_fraction'):
        arrivals(1.0, 10.0, small_fraction=1.0)


def test_the_open_loop_sends_on_time_without_waiting_for_answers_and_counts_the_unanswered_as_lost():
    schedule = [Arrival(0.05 * i, 'large') for i in range(8)]

    async def send(outcome, i, start):
        if i == 7:
            await asyncio.sleep(60)  # never answered within the drain
        await asyncio.sleep(0.5)  # each answer takes longer than the whole schedule
        outcome.ended, outcome.status = time.monotonic() - start, OK

    started = time.monotonic()
    outcomes = asyncio.run(open_loop(schedule, drain=1.0, send=send))
    assert time.monotonic() - started < 30  # the drain bounds the wait for the one that never answers (60 s)
    assert [o.scheduled for o in outcomes] == [a.at for a in schedule]
    assert max(o.sent - o.scheduled for o in outcomes) < 0.4  # on schedule, not after earlier answers (0.5 s)
    assert [o.status for o in outcomes] == [OK] * 7 + [LOST]
    assert outcomes[-1].ended is None and outcomes[-1].latency is None
    assert all(o.latency == pytest.approx(0.5, abs=0.2) for o in outcomes[:7])


def _bad_server(name: str, args: list[str]):
    from jina.excepts import BadServer
    from jina.proto import jina_pb2

    header = jina_pb2.HeaderProto()
    header.status.code = jina_pb2.StatusProto.ERROR
    header.status.exception.name = name
    header.status.exception.args.extend(args)
    return BadServer(header)


def test_an_executors_overload_relayed_by_the_gateway_is_a_clear_refusal():
    from clipserve.errors import OverloadedError

    error = OverloadedError('overloaded: 64 requests in flight', 'max_requests', 1.0)
    status, detail, limit, retry_after = classify(_bad_server('OverloadedError', [str(a) for a in error.args]))
    assert (status, limit, retry_after) == (REFUSED, 'max_requests', 1.0)
    assert detail.startswith('OverloadedError: overloaded: 64 requests')


def test_an_overload_without_its_limit_is_unclear_and_other_executor_errors_are_errors():
    assert classify(_bad_server('OverloadedError', ['busy']))[0] == UNCLEAR
    assert classify(_bad_server('OverloadedError', ['busy', json.dumps({'limit': 'x'})]))[0] == UNCLEAR
    status, detail, limit, _ = classify(_bad_server('InvalidDocumentError', ['1 document(s) could not be encoded']))
    assert (status, limit) == (ERROR, None) and 'InvalidDocumentError' in detail
    assert classify(ConnectionError('gRPC error: StatusCode.UNAVAILABLE'))[0] == ERROR


def _gateway_error(code, trailing=()):
    """What Jina's client raises for a gRPC status the gateway answered itself: BadServerFlow from the RpcError."""
    import grpc
    from jina.excepts import BadServerFlow

    rpc = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details='too many requests')
    try:
        raise BadServerFlow(f'gRPC error: {code} too many requests') from rpc
    except BadServerFlow as error:
        return error


def test_a_gateways_resource_exhausted_is_clear_with_a_retry_after():
    import grpc

    status, detail, limit, retry_after = classify(
        _gateway_error(grpc.StatusCode.RESOURCE_EXHAUSTED, [('retry-after', '2'), ('limit', 'max_requests')])
    )
    assert (status, limit, retry_after) == (REFUSED, 'max_requests', 2.0)
    assert detail == 'gRPC RESOURCE_EXHAUSTED: too many requests'
    assert classify(_gateway_error(grpc.StatusCode.RESOURCE_EXHAUSTED))[0] == UNCLEAR
    assert classify(_gateway_error(grpc.StatusCode.INTERNAL))[0] == ERROR


def test_percentile_is_numpys_and_nan_for_nothing():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(np.percentile(values, 99))
    assert percentile([None, 2.0, None], 99) == 2.0
    assert np.isnan(percentile([], 50)) and np.isnan(percentile([None], 50))


def test_goodput_counts_correct_answers_over_the_time_they_took_and_in_the_window():
    outcomes = [
        Outcome('large', 0.0, 0.0, ended=4.0, status=OK),
        Outcome('large', 1.0, 1.0, ended=15.0, status=OK),  # answered after the 10 s window
        Outcome('text', 2.0, 2.0, ended=2.1, status=OK),
        Outcome('image', 3.0, 3.1, ended=3.2, status=REFUSED, limit='max_requests', retry_after=1.0),
        Outcome('large', 4.0, 4.0, ended=5.0, status=ERROR, detail='broken'),
        Outcome('large', 5.0, 5.0),  # lost
    ]
    s = summarize(outcomes, seconds=10.0)
    assert (s['sent'], s['ok'], s['refused'], s['error'], s['lost']) == (6, 3, 1, 1, 1)
    assert s['span_s'] == 15.0
    assert s['goodput_requests_per_s'] == pytest.approx(3 / 15) and s['goodput_images_per_s'] == pytest.approx(16 / 15)
    assert s['goodput_requests_per_s_in_window'] == pytest.approx(0.2)
    assert s['goodput_images_per_s_in_window'] == pytest.approx(0.8)
    assert s['sent_per_s'] == {'large': 0.4, 'text': 0.1, 'image': 0.1}
    assert s['max_send_lag_s'] == pytest.approx(0.1)
    assert s['refusal_limits'] == ['max_requests'] and s['error_samples'] == ['broken']
    assert s['kinds']['large'] == {'sent': 4, 'ok': 2, 'refused': 0, 'p50_s': 9.0, 'p99_s': pytest.approx(13.9)}
    assert s['kinds']['image']['refused'] == 1 and np.isnan(s['kinds']['image']['p99_s'])


def test_rss_is_sampled_over_time_for_each_process_until_it_goes():
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.6)'])
    me = os.getpid()
    with RssSampler({'me': me, 'child': child.pid}, interval=0.05) as sampler:
        child.wait()
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a timing
        while len(sampler.samples) < 8 or 'child' in sampler.samples[-1][1]:
            assert time.monotonic() < deadline, sampler.samples
            time.sleep(0.05)
    assert len(sampler.samples) >= 8
    times = [t for t, _, _ in sampler.samples]
    assert times == sorted(times)
    assert all(mb == pytest.approx(vm_rss_mb(me), rel=0.5) for _, rss, _ in sampler.samples for mb in [rss['me']])
    assert 'child' in sampler.samples[0][1] and 'child' not in sampler.samples[-1][1]  # gone: left out
    assert all(load >= 0 for _, _, load in sampler.samples)
    assert vm_rss_mb(child.pid) is None


def test_memory_growth_is_over_the_mean_after_warm_up():
    sampler = RssSampler({'gateway': 1, 'executor': 2})
    sampler.samples = [(t, {'gateway': 100.0, 'executor': 500.0 + 10 * max(0, t - 10)}, 1.0) for t in range(21)]
    growth = memory_growth(sampler, baseline=(5, 10), window=(10, 20))
    assert growth['gateway'] == {
        'baseline_mb': 100.0,
        'peak_mb': 100.0,
        'end_mb': 100.0,
        'peak_growth': 0.0,
        'end_growth': 0.0,
    }
    assert growth['executor']['peak_mb'] == 600.0 and growth['executor']['peak_growth'] == pytest.approx(0.2)
    assert growth['total']['baseline_mb'] == 600.0 and growth['total']['peak_growth'] == pytest.approx(100 / 600)


def test_cpu_seconds_counts_what_a_process_has_used():
    from benchmarks.overload_helpers import cpu_seconds

    before = cpu_seconds(os.getpid())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:
        pass
    assert cpu_seconds(os.getpid()) - before == pytest.approx(0.2, abs=0.05)
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    assert cpu_seconds(child.pid) is None


def test_small_arrivals_are_only_small_requests_at_the_rate_asked_half_texts_half_images():
    schedule = small_arrivals(rate=5.0, seconds=400.0, seed=1)
    kinds = [a.kind for a in schedule]
    assert set(kinds) == {'text', 'image'} and abs(kinds.count('text') / len(kinds) - 0.5) < 0.05
    assert abs(len(schedule) / 400.0 - 5.0) < 0.5 and all(0 < a.at < 400 for a in schedule)
    assert [a.at for a in schedule] == sorted(a.at for a in schedule)
    assert schedule == small_arrivals(rate=5.0, seconds=400.0, seed=1) and small_arrivals(0.0, 10.0) == []
