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

from ..procfs import cpu_seconds, pid_listening_on
from .conftest import TINY, flow_from_yaml, free_port, health, set_port, wait_for

HELD = Path(__file__).parent / 'helpers' / 'held_encoder.py'
MAX_IN_FLIGHT = 3
MAX_STREAM_REQUESTS = 2
MAX_REQUESTS = 4  # the replica's


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
            'py_modules': ['clipserve', str(HELD)],
            # no small reserve: the held requests and the probes are all one-text (small) requests
            'with': {'name': TINY, 'hold_dir': str(hold), 'max_requests': MAX_REQUESTS, 'small_request_reserve': 0},
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


def in_the_executor(flow) -> int:
    """Requests the replica holds (its /clipserve/info, which the replica neither counts nor refuses)."""
    body = {'execEndpoint': '/clipserve/info', 'data': [{}]}
    answer = requests.post(f'http://127.0.0.1:{flow["http"]}/post', json=body, timeout=30).json()
    return int(next(iter(answer['parameters']['__results__'].values()))['requests_in_flight'])


STREAM = """
import sys
from docarray import Document, DocumentArray
from jina import Client
docs = DocumentArray([Document(text=f'{sys.argv[2]}{i}') for i in range(int(sys.argv[3]))])
protocol = sys.argv[4] if len(sys.argv) > 4 else 'grpc'
out = Client(host='127.0.0.1', port=int(sys.argv[1]), protocol=protocol).post('/', docs, request_size=1, prefetch=100)
print(len([d for d in out if d.embedding is not None]))
"""


def stream(flow, count: int, prefix: str = 't', protocol: str = 'grpc') -> subprocess.Popen:
    """A Jina client's stream of `count` one-text requests (prefetch 100, as clip-client's) in a process of its
    own: Jina's synchronous clients share one event loop per process, so two cannot run in one at once."""
    return subprocess.Popen(
        [sys.executable, '-c', STREAM, str(flow[protocol]), prefix, str(count), protocol],
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


def slow_body(port: int) -> socket.socket:
    """An HTTP request whose body never comes: it holds its place in the gateway until closed."""
    sock = socket.create_connection(('127.0.0.1', port))
    sock.sendall(b'POST /post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n')
    return sock


def test_the_gateways_bound_on_requests_in_flight_answers_429_and_resource_exhausted(flow):
    sockets = [slow_body(flow['http']) for _ in range(MAX_IN_FLIGHT)]
    try:
        time.sleep(0.5)
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
