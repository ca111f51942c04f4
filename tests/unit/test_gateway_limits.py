"""The gateway's limits as ASGI layers and plain values (no sockets): bodies refused by their length before
they are read or as they stream, requests in flight bounded (429 + Retry-After, WebSocket 1013), Jina's
HTTP answers given statuses by error kind, the settings. gRPC and real Flows: tests/integration/."""

import asyncio
import dataclasses
import json
import time

import pytest

from clipserve.config.gateway_settings import gateway_settings
from clipserve.errors import DeadlineExceededError, InvalidDocumentError, InvalidParameterError, OverloadedError
from clipserve.serving.gateway import limits
from clipserve.serving.gateway.statuses import ExecutorErrorStatus, error_status


def run(app, scope_type='http', method='POST', path='/post', pieces=(b'',), headers=()):
    """One ASGI exchange: (sent messages, body pieces the app read)."""
    messages = [{'type': 'http.request', 'body': p, 'more_body': i < len(pieces) - 1} for i, p in enumerate(pieces)]
    if scope_type == 'websocket':
        messages = [{'type': 'websocket.connect'}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {'type': scope_type, 'method': method, 'path': path, 'headers': list(headers)}
    asyncio.run(app(scope, receive, send))
    return sent


def status_of(sent):
    start = next(m for m in sent if m['type'] == 'http.response.start')
    return start['status'], dict(start['headers'])


def reading_app(read: list):
    """An app that reads its whole body, then answers 200."""

    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message['type'] == 'http.disconnect':
                raise OSError('disconnected')
            read.append(message.get('body', b''))
            if not message.get('more_body'):
                break
        await send({'type': 'http.response.start', 'status': 200, 'headers': []})
        await send({'type': 'http.response.body', 'body': b'ok'})

    return app


def test_a_body_over_the_limit_is_a_413_from_its_length_before_any_of_it_is_read():
    read = []
    sent = run(limits.BodyLimit(reading_app(read), 100), headers=[(b'content-length', b'101')], pieces=[b'x' * 101])
    status, headers = status_of(sent)
    assert status == 413 and headers[b'connection'] == b'close' and read == []
    assert 'max_body_bytes' in json.loads(sent[-1]['body'])['detail']


def test_a_streamed_body_is_refused_as_it_passes_the_limit_and_the_apps_answer_dropped():
    read = []
    sent = run(limits.BodyLimit(reading_app(read), 100), pieces=[b'x' * 60, b'x' * 60, b'x' * 60])
    assert status_of(sent)[0] == 413 and len(sent) == 2 and b''.join(read) == b'x' * 60
    sent = run(limits.BodyLimit(reading_app(read), 100), path='/v1/embeddings', pieces=[b'x' * 101])
    assert json.loads(sent[-1]['body'])['error']['code'] == 'too_large'  # OpenAI's shape on its routes
    read.clear()
    sent = run(limits.BodyLimit(reading_app(read), 100), pieces=[b'x' * 50, b'x' * 50])
    assert status_of(sent)[0] == 200 and b''.join(read) == b'x' * 100


def test_requests_in_flight_are_bounded_with_a_retryable_429():
    in_flight = limits.InFlight(1, retry_after=2.5)
    release = asyncio.Event()
    outcomes = []

    async def held(scope, receive, send):
        await release.wait()
        await send({'type': 'http.response.start', 'status': 200, 'headers': []})
        await send({'type': 'http.response.body', 'body': b''})

    app = limits.Admission(held, in_flight, exempt=lambda scope: scope.get('path') == '/readyz')

    async def one(path='/post'):
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {'type': 'http.request', 'body': b''}

        await app({'type': 'http', 'method': 'POST', 'path': path, 'headers': []}, receive, send)
        outcomes.append((path, status_of(sent)))

    async def scenario():
        first = asyncio.ensure_future(one())
        await asyncio.sleep(0.05)
        assert in_flight.count == 1
        await one()  # refused at once
        await one('/v1/embeddings')
        readiness = asyncio.ensure_future(one('/readyz'))  # never counted nor refused
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, readiness)

    asyncio.run(scenario())
    refused = [(path, status) for path, (status, _) in outcomes if status == 429]
    assert refused == [('/post', 429), ('/v1/embeddings', 429)] and in_flight.count == 0 and in_flight.refused == 2
    headers = outcomes[0][1][1]
    assert headers[b'retry-after'] == b'3'
    assert sorted(status for _, (status, _) in outcomes) == [200, 200, 429, 429]


def test_a_websocket_past_the_bound_is_closed_with_try_again_later():
    in_flight = limits.InFlight(0, retry_after=1)

    async def never(scope, receive, send):
        raise AssertionError('not admitted')

    sent = run(limits.Admission(never, in_flight, exempt=lambda scope: False), scope_type='websocket')
    assert [m['type'] for m in sent] == ['websocket.accept', 'websocket.close'] and sent[1]['code'] == 1013
    assert 'max_in_flight=0' in sent[1]['reason']


def jina_answer(error: Exception | None) -> bytes:
    """A /post answer as Jina 3.34 writes it: the header first, the error's class name and arguments in it."""
    status = {'code': 0}
    if error is not None:
        status = {
            'code': 1,
            'description': repr(error),
            'exception': {'name': type(error).__name__, 'args': list(error.args), 'stacks': ['  File ...'] * 3},
        }
    body = {'header': {'requestId': 'r', 'status': status}, 'parameters': {}, 'routes': [], 'data': [{'text': 'x'}]}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    'error, expected',
    [
        (OverloadedError('overloaded (max_requests=1)', 'max_requests', 2.0), (429, [(b'retry-after', b'2')])),
        (DeadlineExceededError('waited past its deadline'), (504, [(b'retry-after', b'1')])),
        (InvalidDocumentError([('d', 'not an image')]), None),
        (InvalidParameterError('OverloadedError in its words'), None),
        (None, None),
    ],
)
def test_jinas_http_answers_get_statuses_by_the_errors_kind(error, expected):
    assert error_status(jina_answer(error)) == expected
    body = jina_answer(error)

    async def jina(scope, receive, send):
        await send({'type': 'http.response.start', 'status': 200, 'headers': [(b'content-type', b'application/json')]})
        await send({'type': 'http.response.body', 'body': body})

    sent = run(ExecutorErrorStatus(jina))
    status, headers = status_of(sent)
    assert status == (expected[0] if expected else 200) and sent[-1]['body'] == body  # the body as Jina wrote it


def test_the_gateways_settings_come_from_arguments_then_variables_and_are_checked():
    assert gateway_settings(environ={}).max_in_flight == 512
    values = gateway_settings(environ={'CLIPSERVE_MAX_BODY_BYTES': '2048'}, max_in_flight='7')
    assert (values.max_body_bytes, values.max_in_flight, values.max_request_bytes) == (2048, 7, 64 * 1024 * 1024)
    for bad in ({'max_in_flight': 0}, {'max_body_bytes': 'lots'}, {'retry_after': float('nan')}):
        with pytest.raises(InvalidParameterError, match=next(iter(bad))):
            gateway_settings(environ={}, **bad)
    with pytest.raises(InvalidParameterError, match='CLIPSERVE_MAX_REQUEST_BYTES'):
        gateway_settings(environ={'CLIPSERVE_MAX_REQUEST_BYTES': '-1'})


def test_what_the_gateway_serves_is_in_the_same_typed_settings():
    served = gateway_settings(environ={})
    assert (served.openai_routes, served.playground, served.readiness_interval) == (True, True, 1.0)
    off = gateway_settings(environ={'CLIPSERVE_PLAYGROUND': 'off'}, openai_routes='false', readiness_interval='0.5')
    assert (off.openai_routes, off.playground, off.readiness_interval) == (False, False, 0.5)
    with pytest.raises(InvalidParameterError, match='readiness_interval'):
        gateway_settings(environ={}, readiness_interval=0)
    with pytest.raises(InvalidParameterError, match='playground'):
        gateway_settings(environ={}, playground='sometimes')
    with pytest.raises(dataclasses.FrozenInstanceError):  # read once at start, never changed after
        served.max_in_flight = 1
    with pytest.raises(InvalidParameterError, match='unknown setting'):
        gateway_settings(environ={}, max_inflight=3)


def test_a_capped_stream_reads_its_next_request_only_after_an_answer_and_waits_idle():
    from clipserve.serving.jina.gateway_hooks import StreamCap

    read = []

    async def messages():
        for i in range(4):
            read.append(i)
            yield i

    async def scenario():
        cap = StreamCap(messages(), 2)
        assert [await cap.__anext__(), await cap.__anext__()] == [0, 1]
        third = asyncio.ensure_future(cap.__anext__())
        started = time.process_time()
        await asyncio.sleep(0.3)
        assert not third.done() and read == [0, 1]  # not even read from the transport
        assert time.process_time() - started < 0.1  # waited on an event, not a loop
        cap.answered()
        assert await asyncio.wait_for(third, 1) == 2
        cap.answered(), cap.answered()
        assert [r async for r in cap] == [3]

    asyncio.run(scenario())


def test_capped_prefetch_asks_jina_for_one_above_the_streams_cap_which_is_at_most_the_gateways():
    from clipserve.serving.jina.gateway_hooks import PREFETCH_METADATA, CappedPrefetch

    class Context:
        def __init__(self, metadata):
            self.metadata = metadata

        def invocation_metadata(self):
            return self.metadata

    for sent, stream_cap in (('100', 33), ('5', 5), (None, 33), ('junk', 33)):
        metadata = (('authorization', 't'),) + (((PREFETCH_METADATA, sent),) if sent else ())
        context = CappedPrefetch(Context(metadata), 33)
        assert context.stream_cap == stream_cap
        assert {m[0]: m[1] for m in context.invocation_metadata()} == {
            'authorization': 't',
            PREFETCH_METADATA: str(stream_cap + 1),
        }
        assert [m.key for m in context.invocation_metadata() if m[0] == PREFETCH_METADATA] == [PREFETCH_METADATA]


def test_http_requests_of_one_client_address_pass_a_few_at_a_time_and_other_addresses_do_not_wait():
    from clipserve.serving.gateway.peer_share import PeerShare

    share = PeerShare(2)
    inside = {'a': 0, 'b': 0}
    most = {'a': 0, 'b': 0}
    release = asyncio.Event()

    async def request(peer):
        async with share.share(peer):
            inside[peer] += 1
            most[peer] = max(most[peer], inside[peer])
            await release.wait()
            inside[peer] -= 1

    async def scenario():
        tasks = [asyncio.ensure_future(request('a')) for _ in range(5)] + [asyncio.ensure_future(request('b'))]
        await asyncio.sleep(0.05)
        assert inside == {'a': 2, 'b': 1}  # a's other three wait; b is not behind them
        assert (share.waiting('a'), share.waiting('b')) == (3, 0)
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert most == {'a': 2, 'b': 1} and share._peers == {}  # nothing kept for addresses gone

    asyncio.run(scenario())


def test_a_request_whose_turn_does_not_come_in_time_leaves_the_line_and_loses_nothing():
    from clipserve.serving.gateway.peer_share import PeerShare, TurnTimedOut

    share = PeerShare(1)
    release, order = asyncio.Event(), []

    async def request(name, timeout=None):
        async with share.share('a', timeout):
            order.append(name)
            await release.wait()

    async def scenario():
        first = asyncio.ensure_future(request('first'))
        await asyncio.sleep(0)
        with pytest.raises(TurnTimedOut):
            await request('impatient', timeout=0.05)
        waiting = asyncio.ensure_future(request('patient'))
        cancelled = asyncio.ensure_future(request('cancelled'))
        await asyncio.sleep(0)
        assert share.waiting('a') == 2
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert share.waiting('a') == 1  # the cancelled one left the line
        release.set()
        await asyncio.wait_for(asyncio.gather(first, waiting), 5)
        assert order == ['first', 'patient'] and share._peers == {}

    asyncio.run(scenario())
