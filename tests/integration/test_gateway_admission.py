"""Load at the gateway, on flows/multi-protocol.yml with its encoder held (helpers/held_encoder.py) so that
requests are provably in flight: the gateway's own bound (HTTP 429 + Retry-After, gRPC RESOURCE_EXHAUSTED),
requests of one client stream held to max_stream_requests, a replica's overload and a passed deadline
answered by their kind on every protocol, and requests whose client gave up cancelled down to the executor."""

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import requests
from clip_client import Client as ClipClient
from docarray import Document, DocumentArray
from jina import Client

from devkit.procfs import cpu_seconds, pid_listening_on

from .conftest import TINY, flow_from_yaml, free_port, health, set_port, wait_for

HELD = Path(__file__).parent / 'helpers' / 'held_encoder.py'
MAX_IN_FLIGHT = 3
MAX_STREAM_REQUESTS = 2
MAX_REQUESTS = 4  # the replica's
EXECUTOR = 'clip_t'  # flows/multi-protocol.yml's
LARGE = 5  # texts in a request the replica counts as large (more than its small bound, 4)


@pytest.fixture(scope='module')
def flow(tmp_path_factory):
    hold = tmp_path_factory.mktemp('hold')
    ports = [free_port() for _ in range(3)]
    metrics = free_port()

    def edit(config):
        set_port(config, ports)
        config['gateway']['uses_with'] = {'max_in_flight': MAX_IN_FLIGHT, 'max_stream_requests': MAX_STREAM_REQUESTS}
        config['with'] = {'monitoring': True, 'port_monitoring': metrics}
        executor = config['executors'][0]
        executor['uses'] = {
            'jtype': 'HeldCLIPEncoder',
            'py_modules': ['clipserve.serving', str(HELD)],
            # no small reserve: the held requests and the probes are all one-text (small) requests; no queue: the
            # replica refuses at once past max_requests (the queue itself: tests/integration/test_legacy_flows.py)
            'with': {
                'name': TINY,
                'hold_dir': str(hold),
                'max_requests': MAX_REQUESTS,
                'small_request_reserve': 0,
                'max_queued_requests': 0,
            },
        }

    with flow_from_yaml('multi-protocol.yml', tmp_path_factory.mktemp('flows'), edit, {'CLIPSERVE_MODEL': TINY}):
        ports = dict(zip(['grpc', 'http', 'websocket'], ports))
        wait_for(lambda: health(ports['grpc']) == 'SERVING', 60, 'the Flow to be ready')
        yield {**ports, 'hold': hold, 'metrics': metrics}


class Held:
    """While inside: every encoding request waits in the executor; the held requests are released on exit."""

    def __init__(self, flow):
        self.dir = flow['hold']

    def __enter__(self):
        for started in self.dir.glob('encode.started.*'):
            started.unlink()
        (self.dir / 'encode.hold').touch()
        return self

    def __exit__(self, *exc):
        (self.dir / 'encode.hold').unlink()


def executor_info(flow) -> dict:
    """The replica's /clipserve/info (which the replica neither counts nor refuses)."""
    body = {'execEndpoint': '/clipserve/info', 'data': [{}]}
    answer = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=30).json()
    return next(iter(answer['parameters']['__results__'].values()))


def in_the_executor(flow) -> int:
    """Requests the replica holds."""
    return int(executor_info(flow)['requests_in_flight'])


STREAM = """
import sys
from docarray import Document, DocumentArray
from jina import Client
size = int(sys.argv[5])
docs = DocumentArray([Document(text=f'{sys.argv[2]}{i}') for i in range(int(sys.argv[3]) * size)])
protocol = sys.argv[4]
out = Client(host='127.0.0.1', port=int(sys.argv[1]), protocol=protocol).post('/', docs, request_size=size, prefetch=100)
print(len([d for d in out if d.embedding is not None]))
"""


def stream(flow, count: int, prefix: str = 't', protocol: str = 'grpc', size: int = 1) -> subprocess.Popen:
    """A Jina client's stream of `count` requests of `size` texts (prefetch 100, as clip-client's) in a process of
    its own: Jina's synchronous clients share one event loop per process, so two cannot run in one at once."""
    return subprocess.Popen(
        [sys.executable, '-c', STREAM, str(flow[protocol]), prefix, str(count), protocol, str(size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def served(process: subprocess.Popen) -> int:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return int(out.split()[-1])


def in_background(call):
    """`call()` in a thread (plain HTTP: `requests` is safe in threads): (thread, {'value' or 'error'})."""
    outcome = {}

    def run():
        try:
            outcome['value'] = call()
        except Exception as error:  # the test reads it
            outcome['error'] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def post_v1(flow, body, headers=None, timeout=60):
    return requests.post(f'http://127.0.0.1:{flow["http"]}/v1/embeddings', json=body, headers=headers, timeout=timeout)


@pytest.mark.parametrize('protocol', ['grpc', 'websocket'])
def test_one_client_stream_holds_at_most_max_stream_requests_and_the_rest_wait(flow, protocol):
    gateway = pid_listening_on(flow['grpc'])
    with Held(flow):
        client = stream(flow, 10, protocol=protocol)
        wait_for(lambda: in_the_executor(flow) == MAX_STREAM_REQUESTS, 60, 'the stream to fill its share')
        time.sleep(1)
        assert in_the_executor(flow) == MAX_STREAM_REQUESTS  # not the 10 the client asked for at once
        before = cpu_seconds(gateway)
        time.sleep(3)
        # the stream waits without a busy loop (Jina's own prefetch wait spun the gateway's event loop: ~3 s)
        assert cpu_seconds(gateway) - before < 0.6
    assert served(client) == 10  # all served, none refused


def test_a_replicas_overload_is_a_retryable_refusal_naming_its_limit_on_every_protocol(flow):
    with Held(flow):
        streams = [stream(flow, MAX_STREAM_REQUESTS) for _ in range(MAX_REQUESTS // MAX_STREAM_REQUESTS)]
        wait_for(lambda: in_the_executor(flow) == MAX_REQUESTS, 60, 'the replica to be full')
        reply = post_v1(flow, {'input': ['x']})
        assert reply.status_code == 429 and reply.headers['retry-after'] == '1'
        assert reply.json()['error']['code'] == 'overloaded' and 'max_requests' in reply.json()['error']['message']
        body = {'execEndpoint': '/', 'data': [{'text': 'x'}]}
        post = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=60)
        assert post.status_code == 429 and post.headers['retry-after'] == '1'
        assert post.json()['header']['status']['exception']['name'] == 'OverloadedError'  # Jina's body, as it was
        with pytest.raises(Exception, match='max_requests'):
            ClipClient(f'grpc://127.0.0.1:{flow["grpc"]}').encode(['x'])
    assert [served(client) for client in streams] == [MAX_STREAM_REQUESTS] * len(streams)


def test_a_large_request_every_replica_would_refuse_is_refused_by_the_gateway_without_the_executor(flow):
    """The gateway mirrors the replica's bound (replica_room.py): with the replica's places full of large
    requests, the next large one is answered by the gateway with the replica's own error, on every protocol,
    and never reaches the executor (its count of refusals stays); the places come back when answered."""
    large = [f'big {i}' for i in range(LARGE)]
    refused_before = int(executor_info(flow)['refused'])
    with Held(flow):
        streams = [stream(flow, MAX_STREAM_REQUESTS, size=LARGE) for _ in range(MAX_REQUESTS // MAX_STREAM_REQUESTS)]
        wait_for(lambda: in_the_executor(flow) == MAX_REQUESTS, 60, 'the replica to be full of large requests')
        with pytest.raises(Exception, match='max_requests'):
            ClipClient(f'grpc://127.0.0.1:{flow["grpc"]}').encode(large, batch_size=LARGE)
        # WebSocket: Jina's client (clip-client's) can lose an error answer when the gateway closes the socket
        # first (docs/limits.md), so the answer is read with on_error
        answers = []
        docs = DocumentArray([Document(text=t) for t in large])
        Client(host='127.0.0.1', port=flow['websocket'], protocol='websocket').post(
            '/', docs, request_size=LARGE, on_error=lambda response: answers.append(response.header.status)
        )
        assert [a.exception.name for a in answers] == ['OverloadedError'] and 'max_requests' in answers[0].description
        body = {'execEndpoint': '/', 'data': [{'text': t} for t in large]}
        post = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=60)
        assert post.status_code == 429 and post.headers['retry-after'] == '1'
        exception = post.json()['header']['status']['exception']
        assert exception['name'] == 'OverloadedError' and 'max_requests' in exception['args'][0]
        assert exception['executor'] == 'HeldCLIPEncoder'  # named as the replica's own error names it
        reply = post_v1(flow, {'input': large})
        assert reply.status_code == 429 and reply.json()['error']['code'] == 'overloaded'
        assert int(executor_info(flow)['refused']) == refused_before  # none of them reached the replica
        assert in_the_executor(flow) == MAX_REQUESTS
    assert [served(client) for client in streams] == [MAX_STREAM_REQUESTS * LARGE] * len(streams)
    reply = post_v1(flow, {'input': large})  # every place given back: admitted again
    assert reply.status_code == 200 and len(reply.json()['data']) == LARGE
    scraped = urllib.request.urlopen(f'http://127.0.0.1:{flow["metrics"]}/', timeout=10).read().decode()
    assert 'clipserve_gateway_refused_total{limit="max_queued_requests",protocol="all"} 4.0' in scraped
    assert f'clipserve_gateway_executor_places{{executor="{EXECUTOR}"}} {MAX_REQUESTS:.1f}' in scraped
    assert f'clipserve_gateway_executor_requests{{executor="{EXECUTOR}"}} 0.0' in scraped


def slow_body(port: int) -> socket.socket:
    """An HTTP request whose body never comes: it holds its place in the gateway until closed."""
    sock = socket.create_connection(('127.0.0.1', port))
    sock.sendall(b'POST /post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n')
    return sock


def test_the_gateways_bound_on_requests_in_flight_answers_429_and_resource_exhausted(flow):
    sockets = [slow_body(flow['http']) for _ in range(MAX_IN_FLIGHT)]
    try:
        wait_for(lambda: gateway_in_flight(flow) == MAX_IN_FLIGHT, 30, 'the slow bodies to hold every place')
        post = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json={'data': [{'text': 'x'}]}, timeout=30)
        assert post.status_code == 429 and post.headers['retry-after'] == '1'
        assert f'max_in_flight={MAX_IN_FLIGHT}' in post.json()['detail']
        reply = post_v1(flow, {'input': ['x']})
        assert reply.status_code == 429 and reply.json()['error']['code'] == 'overloaded'
        with grpc.insecure_channel(f'127.0.0.1:{flow["grpc"]}') as channel:
            call = channel.stream_stream('/jina.JinaRPC/Call')
            with pytest.raises(grpc.RpcError) as refused:
                list(call(iter([b'']), timeout=30))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f'max_in_flight={MAX_IN_FLIGHT}' in refused.value.details()
        assert dict(refused.value.trailing_metadata())['retry-after'] == '1'
        with pytest.raises(Exception, match='max_in_flight'):
            ClipClient(f'grpc://127.0.0.1:{flow["grpc"]}').encode(['x'])
        assert requests.get(f'http://127.0.0.1:{flow["http"]}/readyz', timeout=30).status_code == 200
        assert health(flow['grpc']) == 'SERVING'  # health checks are never refused
    finally:
        for sock in sockets:
            sock.close()
    wait_for(lambda: post_v1(flow, {'input': ['x']}).status_code == 200, 30, 'the places to be given back')
    scraped = urllib.request.urlopen(f'http://127.0.0.1:{flow["metrics"]}/', timeout=10).read().decode()
    assert 'clipserve_gateway_refused_total{limit="max_in_flight",protocol="http"}' in scraped
    assert 'clipserve_gateway_refused_total{limit="max_in_flight",protocol="grpc"}' in scraped
    assert 'clipserve_gateway_requests_in_flight ' in scraped


def test_a_client_timeout_is_a_504_and_the_executor_lets_the_request_go(flow):
    with Held(flow):
        started = time.perf_counter()
        reply = post_v1(flow, {'input': ['late']}, headers={'X-Request-Timeout': '1'})
        assert reply.status_code == 504 and reply.json()['error']['code'] == 'timeout'
        assert time.perf_counter() - started < 5
        wait_for(lambda: in_the_executor(flow) == 0, 10, 'the executor to drop the cancelled request')
        # Jina's HTTP route: the executor's own deadline (the request parameter), past it a 504
        body = {'execEndpoint': '/', 'data': [{'text': 'late'}], 'parameters': {'timeout_seconds': 0.5}}
        thread, outcome = in_background(
            lambda: requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=60)
        )
        time.sleep(1.5)
    thread.join(60)
    answer = outcome['value']
    assert answer.status_code == 504, answer.text[:500]
    assert answer.json()['header']['status']['exception']['name'] == 'DeadlineExceededError'


def gateway_in_flight(flow) -> float:
    """The gateway's clipserve_gateway_requests_in_flight, scraped from its monitoring port."""
    scraped = urllib.request.urlopen(f'http://127.0.0.1:{flow["metrics"]}/', timeout=10).read().decode()
    return float(
        next(
            line.split()[-1]
            for line in scraped.splitlines()
            if line.startswith('clipserve_gateway_requests_in_flight ')
        )
    )


def test_a_v1_request_waiting_for_its_addresss_turn_is_a_504_when_its_timeout_passes(flow):
    with Held(flow):
        holders = [
            in_background(lambda i=i: post_v1(flow, {'input': [f'held{i}']})) for i in range(MAX_STREAM_REQUESTS)
        ]
        wait_for(lambda: gateway_in_flight(flow) == MAX_STREAM_REQUESTS, 30, 'the held requests to take their turns')
        started = time.perf_counter()
        reply = post_v1(flow, {'input': ['late']}, headers={'X-Request-Timeout': '1'})
        waited = time.perf_counter() - started
    for thread, outcome in holders:
        thread.join(60)
        assert outcome['value'].status_code == 200, outcome
    error = reply.json()['error']
    assert reply.status_code == 504 and error['code'] == 'timeout' and 'max_stream_requests' in error['message']
    assert 0.9 < waited < 4


def test_a_request_whose_client_disconnects_is_cancelled_down_to_the_executor(flow):
    with Held(flow):
        sock = socket.create_connection(('127.0.0.1', flow['http']))
        body = json.dumps({'input': ['gone']}).encode()
        sock.sendall(
            b'POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n\r\n%s' % (len(body), body)
        )
        wait_for(lambda: in_the_executor(flow) == 1, 30, 'the request to reach the executor')
        sock.close()
        wait_for(lambda: in_the_executor(flow) == 0, 10, 'the executor to let the request go')
