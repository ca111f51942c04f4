"""The gateway's /v1 routes as an ASGI app, in front of a stand-in for the Flow (no sockets, no executors):
model picking, the body cap, errors in OpenAI's shape and by kind, deadlines, disconnects, the page.
Real Flows: tests/integration/test_openai_api.py."""

import asyncio
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from docarray.score import NamedScore

from clipserve.errors import DeadlineExceededError, InvalidDocumentError, OverloadedError, PayloadTooLargeError
from clipserve.serving.gateway import flow_calls as gw
from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway import openai_routes as routes_
from clipserve.serving.gateway.api_error import AUTH_ERROR
from clipserve.serving.replica.documents import TOKEN_COUNT_TAG

INFO = {
    'clip_default/rep-0': {
        'model': 'ViT-B-32::openai',
        'configured_name': 'ViT-B/32',
        'embed_dim': 4,
        'serve_default': True,
    },
    'clip_large/rep-0': {
        'model': 'ViT-L-14::openai',
        'configured_name': 'ViT-L-14::openai',
        'embed_dim': 6,
        'serve_default': False,
    },
    'an_indexer': {'something': 'else'},
}


class StandIn(gw.FlowCalls):
    """FlowCalls whose executors are this object: embeddings [1, 2, ...] per document, texts 3 tokens."""

    def __init__(self, fail=None, hold: float = 0.0):
        super().__init__(streamer=None, logger=SimpleNamespace(warning=print, error=print))
        self.sent = []
        self.fail = fail
        self.hold = hold
        self.cancelled = 0

    async def call(self, endpoint, docs, parameters, params):
        self.sent.append((endpoint, docs, parameters))
        if endpoint == '/clipserve/info':
            return SimpleNamespace(parameters={'__results__': INFO}, docs=docs)
        if self.hold:
            try:
                await asyncio.sleep(self.hold)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail:  # as Jina relays an executor's exception: its class name and arguments
            raise gw.executor_error(type(self.fail).__name__, list(self.fail.args), params)
        dim = 6 if 'ViT-L' in endpoint else 4
        everyone = [d for q in docs for d in (q, *q.matches)]
        for i, doc in enumerate(everyone):
            doc.embedding = np.arange(1, dim + 1, dtype=np.float32) * (i + 1)
            if doc.text:
                doc.tags[TOKEN_COUNT_TAG] = 3
        for query in docs:
            for rank, match in enumerate(reversed(query.matches)):
                match.scores['clip_score'] = NamedScore(value=0.5 / (rank + 1))
                match.scores['clip_score_cosine'] = NamedScore(value=0.1)
            query.matches = list(reversed(query.matches))
        return SimpleNamespace(docs=docs, parameters={})


def request(app, method, path, body=b'', headers=(), leave_after=None):
    """One ASGI request: (status, headers, body). The client stays connected until the answer, or leaves
    `leave_after` seconds after sending its body."""
    messages = [{'type': 'http.request', 'body': body, 'more_body': False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        if leave_after is None:
            await asyncio.Event().wait()  # connected: nothing more to say
        await asyncio.sleep(leave_after)
        return {'type': 'http.disconnect'}

    async def send(message):
        sent.append(message)

    scope = {
        'type': 'http',
        'method': method,
        'path': path,
        'headers': [(k.lower(), v) for k, v in headers],
        'query_string': b'',
        'scheme': 'http',
        'server': ('127.0.0.1', 8080),
        'root_path': '',
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m['type'] == 'http.response.start')
    return start['status'], dict(start['headers']), b''.join(m.get('body', b'') for m in sent[1:])


def routes(flow=None, max_body_bytes=10_000, max_inputs=api.MAX_INPUTS):
    async def jina_app(scope, receive, send):
        await send({'type': 'http.response.start', 'status': 299, 'headers': []})
        await send({'type': 'http.response.body', 'body': b'jina'})

    flow = flow or StandIn()
    logger = SimpleNamespace(warning=print, error=print)
    limits = SimpleNamespace(max_body_bytes=max_body_bytes, max_inputs=max_inputs)
    return routes_.OpenAIRoutes(jina_app, flow, limits, routes_.OpenAIMetrics(), True, logger), flow


def post(app, path, body):
    status, _, raw = request(app, 'POST', path, json.dumps(body).encode())
    return status, json.loads(raw)


def test_models_come_from_every_executors_info_the_default_first():
    models = gw.served_models(INFO)
    assert [(m.name, m.embed_dim, m.default, m.aliases) for m in models] == [
        ('ViT-B-32::openai', 4, True, ('ViT-B/32',)),
        ('ViT-L-14::openai', 6, False, ()),
    ]
    assert gw.pick_model(models, None).name == 'ViT-B-32::openai'
    for name in ('ViT-L-14::openai', 'ViT-L/14', 'ViT-L-14'):
        assert gw.pick_model(models, name).name == 'ViT-L-14::openai'
    assert gw.pick_model(models, 'ViT-B/32').name == 'ViT-B-32::openai'
    assert gw.pick_model(models, 'text-embedding-3-small') is None


def test_embeddings_go_to_the_models_encode_route_and_come_back_normalised():
    app, flow = routes()
    status, answer = post(
        app, '/v1/embeddings', {'model': 'ViT-L/14', 'input': ['a', {'image': 'https://x.org/a.png'}]}
    )
    assert status == 200 and answer['model'] == 'ViT-L-14::openai'
    endpoint, docs, parameters = flow.sent[-1]
    assert endpoint == '/encode/ViT-L-14::openai' and parameters == {'drop_image_content': True, 'token_counts': True}
    assert [d.id for d in docs] == ['input-0', 'input-1'] and docs[1].uri == 'https://x.org/a.png'
    vectors = np.array([d['embedding'] for d in answer['data']])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    assert answer['usage'] == {'prompt_tokens': 3, 'total_tokens': 3}  # one text; the image counts 0


def test_rank_answers_indices_best_first():
    app, flow = routes()
    status, answer = post(app, '/v1/rank', {'query': 'q', 'documents': ['a', 'b', 'c'], 'top_n': 2})
    assert status == 200 and flow.sent[-1][0] == '/rank/ViT-B-32::openai'
    assert [r['index'] for r in answer['results']] == [2, 1] and answer['results'][0]['clip_score'] == 0.5
    assert answer['usage']['prompt_tokens'] == 12


@pytest.mark.parametrize(
    'failure, status, param',
    [
        (InvalidDocumentError([('input-1', 'not an image Pillow can decode')]), 400, 'input[1]'),
        (
            InvalidDocumentError(
                [('input-0', 'the image blob is 9 bytes, over the limit of 4 bytes (max_image_bytes)')]
            ),
            413,
            'input[0]',
        ),
    ],
)
def test_the_encoders_errors_name_the_items(failure, status, param):
    app, _ = routes(StandIn(fail=failure))
    got, answer = post(app, '/v1/embeddings', {'input': ['a', 'b']})
    assert (got, answer['error']['param']) == (status, param)
    assert answer['error']['message'].startswith(param)


def test_unknown_models_routes_and_methods():
    app, _ = routes()
    status, answer = post(app, '/v1/embeddings', {'model': 'nope', 'input': 'a'})
    assert status == 404 and 'ViT-B-32::openai, ViT-L-14::openai' in answer['error']['message']
    assert post(app, '/v1/chat/completions', {})[0] == 404
    assert request(app, 'GET', '/v1/embeddings')[0] == 405
    assert request(app, 'POST', '/post')[0] == 299  # everything else is Jina's


def test_bodies_over_the_cap_or_not_json_are_refused():
    app, _ = routes(max_body_bytes=100)
    status, _, raw = request(app, 'POST', '/v1/embeddings', b'{"input": "' + b'x' * 200 + b'"}')
    assert status == 413 and 'max_body_bytes' in json.loads(raw)['error']['message']
    status, _, raw = request(app, 'POST', '/v1/embeddings', b'{"input": ', [(b'content-length', b'10')])
    assert status == 400 and json.loads(raw)['error']['code'] == 'invalid_json'
    status, _, raw = request(app, 'POST', '/v1/embeddings', b'[' * 40 + b']' * 40)
    assert status == 400
    app, _ = routes(max_body_bytes=100_000)
    assert request(app, 'POST', '/v1/embeddings', b'[' * 5_000)[0] == 400  # nested too deeply for json
    status, _, raw = request(app, 'POST', '/v1/embeddings', b'{"input": [' + b'{},' * 30_000 + b'{}]}')
    assert status == 400 and json.loads(raw)['error']['code'] == 'too_many_items'  # counted, never built
    app, _ = routes(max_inputs=3)
    status, _, raw = request(app, 'POST', '/v1/embeddings', json.dumps({'input': ['a'] * 4}).encode())
    assert status == 400 and 'max_inputs' in json.loads(raw)['error']['message']


def test_the_playground_page_and_its_policy():
    app, _ = routes()
    status, headers, page = request(app, 'GET', '/playground')
    assert status == 200 and headers[b'content-type'] == b'text/html; charset=utf-8'
    policy = headers[b'content-security-policy'].decode()
    assert (
        "connect-src 'self'" in policy
        and "script-src 'sha256-" in policy
        and 'unsafe-inline' not in policy.split('style-src')[0]
    )
    assert b'/v1/embeddings' in page and b'/v1/rank' in page and b'/v1/models' in page
    assert b'/v1/search' in page and 'img-src data: blob: http: https:;' in policy  # search hits' images
    no_favicon = page.replace(b'<link rel="icon" href="data:,">', b'', 1)  # an empty icon: no /favicon.ico 404
    assert b'<script src' not in page and b'<link' not in no_favicon  # nothing loaded from elsewhere
    assert request(app, 'POST', '/playground')[0] == 405


def test_a_bug_is_still_an_openai_shaped_500(monkeypatch):
    app, _ = routes()

    async def broken(*args):
        raise KeyError('bug')

    monkeypatch.setattr(gw, 'embeddings', broken)  # what the route calls
    status, answer = post(app, '/v1/embeddings', {'input': 'a'})
    assert status == 500 and answer['error']['type'] == 'server_error'


def test_the_api_error_shape():
    assert AUTH_ERROR.body() == {
        'error': {
            'message': AUTH_ERROR.message,
            'type': 'invalid_request_error',
            'param': None,
            'code': 'invalid_api_key',
        }
    }


def test_answers_that_leave_the_body_unread_close_the_connection():
    """Else uvicorn keeps the half-read connection, and waits for it when the gateway stops."""
    app, _ = routes(max_body_bytes=100)
    status, headers, _ = request(app, 'POST', '/v1/embeddings', b'x' * 200, [(b'content-length', b'200')])
    assert status == 413 and headers[b'connection'] == b'close'
    assert b'connection' not in post_headers(app, '/v1/embeddings', {'input': 'a'})


def post_headers(app, path, body):
    return request(app, 'POST', path, json.dumps(body).encode())[1]


def test_the_token_check_covers_the_routes_in_openais_shape_and_leaves_the_page_open():
    from clipserve.serving.gateway.auth import TokenMiddleware

    app, _ = routes()
    guarded = TokenMiddleware(app, 'tok')
    status, headers, raw = request(guarded, 'POST', '/v1/embeddings', b'{"input": "a"}')
    assert status == 401 and json.loads(raw) == AUTH_ERROR.body() and headers[b'connection'] == b'close'
    assert request(guarded, 'GET', '/v1/models', headers=[(b'authorization', b'Bearer tok')])[0] == 200
    assert request(guarded, 'GET', '/playground')[0] == 200
    assert json.loads(request(guarded, 'POST', '/post')[2]) == {'detail': 'missing or wrong Authorization header'}


# ---- errors by kind, deadlines, disconnects -------------------------------------------------------


@pytest.mark.parametrize(
    'failure, status, code, retry_after',
    [
        (OverloadedError('overloaded: 64 requests (max_requests=64)', 'max_requests', 2.5), 429, 'overloaded', '3'),
        (DeadlineExceededError('the request waited past its deadline'), 504, 'deadline_exceeded', '1'),
        (PayloadTooLargeError('too many documents (max_documents=4)'), 413, 'payload_too_large', None),
    ],
)
def test_the_encoders_errors_map_by_their_kind_never_their_words(failure, status, code, retry_after):
    app, _ = routes(StandIn(fail=failure))
    got, headers, raw = request(app, 'POST', '/v1/embeddings', json.dumps({'input': ['a']}).encode())
    error = json.loads(raw)['error']
    assert (got, error['code'], headers.get(b'retry-after')) == (status, code, retry_after and retry_after.encode())
    assert error['message'] == failure.message  # it names the limit


def test_an_unknown_exception_is_a_500_that_does_not_leak_its_words():
    error = gw.executor_error('KeyError', ["'secret internal detail' larger than the limit of 3 bytes"], {})
    assert (error.status, error.code) == (500, 'internal_error') and 'secret' not in error.message
    # the words of a kind's message do not change its status either
    assert gw.executor_error('InvalidParameterError', ['overloaded, retry after 1 s'], {}).status == 400


def test_a_client_timeout_becomes_the_executors_deadline_and_a_504_that_cancels_the_work():
    flow = StandIn(hold=5)
    app, _ = routes(flow)
    started = time.perf_counter()
    headers = [(b'x-request-timeout', b'0.3')]
    status, _, raw = request(app, 'POST', '/v1/embeddings', json.dumps({'input': ['a']}).encode(), headers)
    assert status == 504 and json.loads(raw)['error']['code'] == 'timeout'
    assert time.perf_counter() - started < 3 and flow.cancelled == 1
    endpoint, _, parameters = flow.sent[-1]
    assert endpoint.startswith('/encode/') and 0 < parameters['timeout_seconds'] <= 0.3


def test_the_openai_sdks_own_timeout_is_the_deadline_and_a_bad_header_is_a_400():
    flow = StandIn()
    app, _ = routes(flow)
    body = json.dumps({'input': ['a']}).encode()
    assert request(app, 'POST', '/v1/embeddings', body, [(b'x-stainless-read-timeout', b'600.0')])[0] == 200
    assert 599 < flow.sent[-1][2]['timeout_seconds'] <= 600
    assert request(app, 'POST', '/v1/embeddings', body)[0] == 200 and 'timeout_seconds' not in flow.sent[-1][2]
    assert request(app, 'POST', '/v1/embeddings', body, [(b'x-stainless-read-timeout', b'nan')])[0] == 200
    status, _, raw = request(app, 'POST', '/v1/embeddings', body, [(b'x-request-timeout', b'-1')])
    assert status == 400 and 'x-request-timeout' in json.loads(raw)['error']['message']


def test_a_client_that_disconnects_has_its_request_cancelled():
    flow = StandIn(hold=5)
    app, _ = routes(flow)
    started = time.perf_counter()
    request(app, 'POST', '/v1/embeddings', json.dumps({'input': ['a']}).encode(), leave_after=0.2)
    assert time.perf_counter() - started < 3 and flow.cancelled == 1


def test_a_request_waiting_behind_its_addresss_others_counts_the_wait_against_its_timeout():
    """X-Request-Timeout counts from the request's arrival at the gateway: one held behind the requests of
    its client address (max_stream_requests) gets what is left of it, and a 504 with its body unread once
    its timeout passes while it waits."""
    from clipserve.serving.gateway import limits

    flow = StandIn(hold=1.5)
    app, _ = routes(flow)
    app = limits.Admission(app, limits.InFlight(8, 1.0), lambda scope: False, 1, routes_.on_arrival)
    body = json.dumps({'input': ['a']}).encode()

    async def one(timeout, delay, read):
        await asyncio.sleep(delay)
        messages, sent = [{'type': 'http.request', 'body': body, 'more_body': False}], []

        async def receive():
            if messages:
                read.append(timeout)
                return messages.pop(0)
            await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        headers = [(b'x-request-timeout', timeout.encode())] if timeout else []
        scope = {'type': 'http', 'method': 'POST', 'path': '/v1/embeddings', 'headers': headers}
        scope.update(query_string=b'', scheme='http', server=('127.0.0.1', 8080), client=('10.0.0.1', 4000))
        started = time.perf_counter()
        await app(scope, receive, send)
        start = next(m for m in sent if m['type'] == 'http.response.start')
        raw = b''.join(m.get('body', b'') for m in sent[1:])
        return start['status'], json.loads(raw), time.perf_counter() - started, dict(start['headers'])

    async def scenario():
        read = []
        first, second, third = await asyncio.gather(one(None, 0, read), one('4', 0.05, read), one('0.3', 0.1, read))
        return first, second, third, read

    first, second, third, read = asyncio.run(scenario())
    assert first[0] == 200 and second[0] == 200
    # the second waited ~1.45 s of its 4 for its turn: the executors were given what was left
    assert 2.9 < second[2] and 0 < flow.sent[-1][2]['timeout_seconds'] <= 2.6
    status, answer, waited, headers = third
    assert (
        status == 504 and answer['error']['code'] == 'timeout' and 'max_stream_requests' in answer['error']['message']
    )
    assert waited < 1.2 and read == [None, '4'] and headers.get(b'connection') == b'close'  # never read, never sent
    assert len([endpoint for endpoint, *_ in flow.sent if endpoint.startswith('/encode/')]) == 2
