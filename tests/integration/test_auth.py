"""flows/auth.yml: an optional shared token enforced at the gateway on gRPC, HTTP and WebSocket."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from clip_client import Client as ClipClient

from clipserve_client import Client

from .conftest import TINY, flow_from_yaml, free_port, set_port

TOKEN = 's3cret-token'


@pytest.fixture(scope='module')
def auth_flow(tmp_path_factory):
    ports = [free_port() for _ in range(3)]
    flow = flow_from_yaml('auth.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports),
                          {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_AUTH_TOKEN': TOKEN})
    os.environ['CLIPSERVE_AUTH_TOKEN'] = TOKEN  # the gateway process reads it when it starts
    try:
        with flow:
            yield dict(zip(['grpc', 'http', 'websocket'], ports))
    finally:
        os.environ.pop('CLIPSERVE_AUTH_TOKEN', None)


def test_grpc_needs_the_token(auth_flow):
    url = f'grpc://127.0.0.1:{auth_flow["grpc"]}'
    assert ClipClient(url, credential={'Authorization': TOKEN}).encode(['hi']).shape == (1, 64)
    with pytest.raises(Exception, match='UNAUTHENTICATED'):
        ClipClient(url).encode(['hi'])
    with pytest.raises(Exception, match='UNAUTHENTICATED'):
        ClipClient(url, credential={'Authorization': 'wrong'}).encode(['hi'])


def test_http_needs_the_token(auth_flow):
    url = f'http://127.0.0.1:{auth_flow["http"]}/post'
    body = {'execEndpoint': '/', 'data': [{'text': 'hello'}]}
    assert requests.post(url, json=body, timeout=30).status_code == 401
    assert requests.post(url, json=body, headers={'Authorization': 'wrong'}, timeout=30).status_code == 401
    for header in (TOKEN, f'Bearer {TOKEN}'):
        reply = requests.post(url, json=body, headers={'Authorization': header}, timeout=30)
        assert reply.status_code == 200 and len(reply.json()['data'][0]['embedding']) == 64


@pytest.mark.parametrize('protocol', ['grpc', 'http', 'websocket'])
def test_clipserve_client_sends_the_token_on_every_protocol(auth_flow, protocol):
    scheme = {'grpc': 'grpc', 'http': 'http', 'websocket': 'ws'}[protocol]
    url = f'{scheme}://127.0.0.1:{auth_flow[protocol]}'
    assert Client(url, credential={'Authorization': TOKEN}).encode(['hi']).shape == (1, 64)
    with pytest.raises(Exception):
        Client(url, retries=0).encode(['hi'])


def test_health_checks_stay_open(auth_flow):
    assert requests.get(f'http://127.0.0.1:{auth_flow["http"]}/status', timeout=30).status_code == 200
    jina = str(Path(sys.executable).parent / 'jina')
    ping = subprocess.run([jina, 'ping', 'flow', f'grpc://127.0.0.1:{auth_flow["grpc"]}'], capture_output=True, timeout=120)
    assert ping.returncode == 0
