"""flows/auth.yml: an optional shared token enforced at the gateway on gRPC, HTTP and WebSocket."""

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import requests
from clip_client import Client as ClipClient
from google.protobuf.empty_pb2 import Empty
from grpc_health.v1 import health_pb2, health_pb2_grpc
from jina.proto import jina_pb2, jina_pb2_grpc

try:  # the Jina-protocol client (gRPC, HTTP, WebSocket), an extra of clipserve_client since its split
    from clipserve_client.jina import Client
except ImportError:
    from clipserve_client import Client

from devkit.procfs import pid_listening_on, reset_peak, status_mib

from .conftest import TINY, flow_from_yaml, free_port, set_port
from .rawgrpc import declared_call

TOKEN = 's3cret-token'


@pytest.fixture(scope='module')
def auth_flow(tmp_path_factory):
    ports = [free_port() for _ in range(3)]
    flow = flow_from_yaml(
        'auth.yml',
        tmp_path_factory.mktemp('flows'),
        lambda c: set_port(c, ports),
        {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_AUTH_TOKEN': TOKEN},
    )
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


def test_a_refused_streaming_client_always_sees_unauthenticated(auth_flow):
    """Refusing while the client still writes used to surface as a failed write (INTERNAL) about one
    call in four: the gateway now reads what the client sends before refusing."""
    url = f'grpc://127.0.0.1:{auth_flow["grpc"]}'
    outcomes = []
    for _ in range(20):
        try:
            ClipClient(url).encode(['hi'])
            outcomes.append('served')
        except Exception as error:
            outcomes.append('UNAUTHENTICATED' if 'UNAUTHENTICATED' in str(error) else str(error)[:200])
    assert outcomes == ['UNAUTHENTICATED'] * 20, outcomes


MiB = 1024 * 1024


def test_a_512_mib_grpc_message_without_the_token_is_refused_at_once_and_never_buffered(auth_flow):
    """A call without the token is refused from its metadata, none of its message read: gRPC (1.68) buffers a
    whole message before it checks its size against max_request_bytes (grpc/grpc#43012), so reading it to
    refuse it would hold all of it. Measured on the gateway's own process, its peak resident memory during
    the call (VmHWM, reset just before); the time with a client that does not build the message first."""
    port = auth_flow['grpc']
    gateway = pid_listening_on(port)
    before = reset_peak(gateway)
    refused = declared_call(port, '/jina.JinaRPC/Call', 512 * MiB)
    grown = status_mib(gateway, 'VmHWM') - before
    print(
        f'512 MiB gRPC message without the token: ended by {refused.ended_by} after {refused.seconds:.2f} s, '
        f'{refused.sent / MiB:.1f} MiB taken, gateway grew {grown:.0f} MiB'
    )
    assert refused.ended_by in ('trailers', 'reset') and refused.seconds < 5, refused  # not after 512 MiB
    assert refused.sent < 64 * MiB and grown < 64, (refused, grown)
    # the same through a gRPC library (clip-client's method; the bytes sent as they are): the status it sees
    payload = bytes(512 * MiB)
    with grpc.insecure_channel(f'127.0.0.1:{port}', options=[('grpc.max_send_message_length', -1)]) as channel:
        before = reset_peak(gateway)
        with pytest.raises(grpc.RpcError) as error:
            list(channel.stream_stream('/jina.JinaRPC/Call')(iter([payload]), timeout=120))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert status_mib(gateway, 'VmHWM') - before < 64
    assert ClipClient(f'grpc://127.0.0.1:{port}', credential={'Authorization': TOKEN}).encode(['hi']).shape == (1, 64)


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
    refusal = {'grpc': 'UNAUTHENTICATED', 'http': 'HTTP 401', 'websocket': 'HTTP 403'}[protocol]
    for credential in ({}, {'Authorization': 'wrong'}):
        with pytest.raises(Exception, match=refusal):
            Client(url, credential=credential, retries=0).encode(['hi'])


def test_health_checks_stay_open_and_say_only_ready_or_not(auth_flow):
    jina = str(Path(sys.executable).parent / 'jina')
    ping = subprocess.run(
        [jina, 'ping', 'flow', f'grpc://127.0.0.1:{auth_flow["grpc"]}'], capture_output=True, timeout=120
    )
    assert ping.returncode == 0
    dry_run = requests.get(f'http://127.0.0.1:{auth_flow["http"]}/dry_run', timeout=30)
    assert dry_run.status_code == 200 and set(dry_run.json()) == {'code'}
    with grpc.insecure_channel(f'127.0.0.1:{auth_flow["grpc"]}') as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        status = jina_pb2_grpc.JinaGatewayDryRunRPCStub(channel).dry_run(Empty(), timeout=30)
        assert status == jina_pb2.StatusProto(code=status.code)  # nothing but the code
        readiness = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service='readiness'), timeout=30
        )
        assert readiness.status == health_pb2.HealthCheckResponse.SERVING
    for port in (auth_flow['http'], auth_flow['websocket']):
        for path, word in (('/readyz', 'ready'), ('/livez', 'live')):
            reply = requests.get(f'http://127.0.0.1:{port}{path}', timeout=30)
            assert reply.status_code == 200 and reply.json() == {'status': word}


@pytest.mark.parametrize('path', ['/', '/status', '/docs', '/openapi.json', '/redoc', '/post', '/encode'])
def test_http_debug_and_info_routes_need_the_token(auth_flow, path):
    url = f'http://127.0.0.1:{auth_flow["http"]}{path}'
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, headers={'Authorization': TOKEN}, timeout=30).status_code != 401


def test_grpc_info_and_reflection_need_the_token(auth_flow):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f'127.0.0.1:{auth_flow["grpc"]}') as channel:
        info = jina_pb2_grpc.JinaInfoRPCStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            info._status(Empty(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info._status(Empty(), metadata=[('authorization', TOKEN)], timeout=30).jina
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services='')
        with pytest.raises(grpc.RpcError) as refused:
            list(reflect.ServerReflectionInfo(iter([ask]), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        [answer] = reflect.ServerReflectionInfo(iter([ask]), metadata=[('authorization', TOKEN)], timeout=30)
        assert answer.list_services_response.service


def _start(env):
    """`jina flow --uses flows/auth.yml` (tiny model, free ports) in a fresh process, until it serves gRPC
    or exits: (exit code or None while serving, its output)."""
    import tempfile
    import time

    import yaml

    from .conftest import ROOT, stop_process

    config = yaml.safe_load((ROOT / 'flows' / 'auth.yml').read_text())
    ports = [free_port() for _ in range(3)]
    config['gateway']['port'] = ports
    folder = Path(tempfile.mkdtemp())
    (folder / 'auth.yml').write_text(yaml.safe_dump(config, sort_keys=False))
    log = folder / 'log.txt'
    with open(log, 'w') as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / 'jina'), 'flow', '--uses', str(folder / 'auth.yml')],
            env={**os.environ, 'CLIPSERVE_MODEL': TINY, 'COLUMNS': '300', **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + 120
    try:
        while process.poll() is None and time.time() < deadline:
            with grpc.insecure_channel(f'127.0.0.1:{ports[0]}') as channel:
                try:
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    time.sleep(0.5)
    finally:
        returncode = process.poll()
        stop_process(process)
    return returncode, log.read_text()


def test_without_a_token_the_auth_flow_refuses_to_start():
    returncode, output = _start({'CLIPSERVE_AUTH_TOKEN': '', 'CLIPSERVE_AUTH': ''})
    assert returncode not in (None, 0), output[-3000:]
    assert 'CLIPSERVE_AUTH_TOKEN is not set' in output and 'CLIPSERVE_AUTH=off' in output


def test_opting_out_of_the_token_is_explicit_and_logged():
    returncode, output = _start({'CLIPSERVE_AUTH_TOKEN': '', 'CLIPSERVE_AUTH': 'off'})
    assert returncode is None, output[-3000:]  # it served
    assert 'authentication is OFF' in output
