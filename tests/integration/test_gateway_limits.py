"""The gateway's size limits with their defaults, on flows/multi-protocol.yml (gRPC, HTTP, WebSocket; no token):
bodies and messages over the limit are refused before they are read or parsed, measured on the gateway's
own process; and the clients of old pipelines (clip-client 0.8.3, Jina's client) work as before."""

import json
import time

import numpy as np
import pytest
import requests
from clip_client import Client as ClipClient
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from devkit.procfs import pid_listening_on, reset_peak, status_mib

from .conftest import TINY, flow_from_yaml, free_port, health, make_image, set_port, wait_for
from .rawhttp import exchange, pieces_of, repeated

MiB = 1024 * 1024
MAX_BODY_BYTES = 32 * MiB  # the gateway's default for one HTTP body (max_body_bytes)
MAX_REQUEST_BYTES = 64 * MiB  # and for one gRPC or WebSocket message (max_request_bytes)
SOCKET_BUFFERS = 12 * MiB  # what loopback's socket buffers take that the server never read


@pytest.fixture(scope='module')
def flow(tmp_path_factory):
    ports = [free_port() for _ in range(3)]
    with flow_from_yaml(
        'multi-protocol.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports), {'CLIPSERVE_MODEL': TINY}
    ):
        ports = dict(zip(['grpc', 'http', 'websocket'], ports))
        wait_for(lambda: health(ports['grpc']) == 'SERVING', 60, 'the Flow to be ready')
        yield {**ports, 'gateway': pid_listening_on(ports['http'])}


def measured(flow, send):
    """(what `send()` returned, seconds, the gateway's peak growth in MiB while it ran)."""
    before = reset_peak(flow['gateway'])
    started = time.perf_counter()
    answer = send()
    seconds = time.perf_counter() - started
    return answer, seconds, status_mib(flow['gateway'], 'VmHWM') - before


EMPTY_ITEMS = 48 * MiB // 3  # '{},' each: a 48 MiB body


@pytest.mark.parametrize('declared', [True, False], ids=['content-length', 'chunked'])
def test_a_48_mib_v1_body_is_a_413_before_it_is_parsed(flow, declared):
    body = repeated(b'{"input": [', b'{},', EMPTY_ITEMS, b'{}]}')
    length = len(b'{"input": [') + 3 * EMPTY_ITEMS + len(b'{}]}') if declared else None
    answer, seconds, grown = measured(
        flow,
        lambda: exchange(flow['http'], 'POST', '/v1/embeddings', body, [('Content-Type', 'application/json')], length),
    )
    print(
        f'48 MiB /v1 body ({"declared" if declared else "chunked"}): {answer.status} after {seconds:.2f} s, '
        f'{answer.sent / MiB:.0f} MiB taken, gateway grew {grown:.0f} MiB'
    )
    assert answer.status == 413, answer
    error = json.loads(answer.body)['error']
    assert (
        error['code'] == 'too_large'
        and 'max_body_bytes' in error['message']
        and str(MAX_BODY_BYTES) in error['message']
    )
    assert grown < 64 and seconds < 5, (grown, seconds)
    # what was sent beyond what the gateway read waits in the sockets' buffers (a few MiB on loopback)
    if declared:
        assert answer.sent < SOCKET_BUFFERS  # refused from its Content-Length
    else:
        assert answer.sent <= MAX_BODY_BYTES + SOCKET_BUFFERS


def test_too_large_bodies_on_jinas_http_routes_are_413s(flow):
    declared = exchange(flow['http'], 'POST', '/post', pieces_of(b'x' * MiB), [], MAX_BODY_BYTES + 1)
    assert declared.status == 413 and declared.sent < SOCKET_BUFFERS and 'max_body_bytes' in declared.body.decode()
    chunked, seconds, grown = measured(
        flow, lambda: exchange(flow['http'], 'POST', '/post', repeated(b'{"data": [', b'{},', 12 * MiB, b'{}]}'), [])
    )
    assert chunked.status == 413 and MAX_BODY_BYTES <= chunked.sent <= MAX_BODY_BYTES + SOCKET_BUFFERS, chunked
    assert grown < 2 * MAX_BODY_BYTES / MiB, grown
    # the same gateway keeps serving Jina's own HTTP clients
    body = {'execEndpoint': '/', 'data': [{'text': 'hello'}]}
    reply = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=60)
    assert reply.status_code == 200 and len(reply.json()['data'][0]['embedding']) == 64


def test_a_websocket_message_over_the_limit_closes_the_connection(flow):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f'ws://127.0.0.1:{flow["websocket"]}/', max_size=None, open_timeout=30) as ws:
        started = time.perf_counter()
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(bytes(MAX_REQUEST_BYTES + 1))
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value  # message too big
    assert time.perf_counter() - started < 10


def test_more_inputs_than_openai_allows_are_refused_naming_the_limit(flow):
    reply = requests.post(f'http://127.0.0.1:{flow["http"]}/v1/embeddings', json={'input': ['x'] * 2049}, timeout=60)
    assert reply.status_code == 400 and '2048' in reply.json()['error']['message']
    assert (
        requests.post(
            f'http://127.0.0.1:{flow["http"]}/v1/embeddings', json={'input': ['x'] * 2048}, timeout=120
        ).status_code
        == 200
    )


@pytest.mark.parametrize('protocol', ['grpc', 'websocket'])
def test_clip_client_works_as_before_with_the_default_limits(flow, protocol, tmp_path):
    scheme = {'grpc': 'grpc', 'websocket': 'ws'}[protocol]
    client = ClipClient(f'{scheme}://127.0.0.1:{flow[protocol]}')
    texts = [f'text number {i}' for i in range(300)]
    paths = []
    for i in range(12):
        paths.append(str(tmp_path / f'{i}.png'))
        (tmp_path / f'{i}.png').write_bytes(make_image(64, 48, seed=i))
    reference = client.encode(texts[:3] + paths[:3], batch_size=8)
    for batch_size in (1, 8, 256):
        vectors = client.encode(texts + paths, batch_size=batch_size)
        assert vectors.shape == (312, 64)
        np.testing.assert_allclose(vectors[[0, 1, 2, 300, 301, 302]], reference, atol=1e-5)


@pytest.mark.parametrize('protocol', ['grpc', 'http', 'websocket'])
def test_jinas_own_client_works_as_before(flow, protocol):
    client = JinaClient(host='127.0.0.1', port=flow[protocol], protocol=protocol)
    docs = DocumentArray([Document(text=f't{i}') for i in range(40)] + [Document(blob=make_image(seed=1))])
    out = client.post('/', docs, request_size=16)
    assert len(out) == 41 and all(d.embedding is not None and d.embedding.shape == (64,) for d in out)
    if protocol == 'grpc':  # gRPC's unary method too (process_single_data), which the gateway reads itself
        out = client.post('/', docs, request_size=16, stream=False)
        assert len(out) == 41 and all(d.embedding is not None for d in out)
