"""flows/secure-v2.yml (TLS, the token, two replicas) and flows/shards-v2.yml (two shards) in the DocArray v2
environment, over gRPC, HTTP and WebSocket at once: embeddings equal to the v1 Flow's (cosine >= 0.99999),
the token refused when missing, readiness, and the OpenAI-compatible routes as in the v1 flavour.
"""

import grpc
import numpy as np
import pytest
import requests
from docarray import DocList
from jina import Client
from jina.excepts import BadServer

from clipserve.serving.schemas import ClipDoc, ClipMatch, ClipQuery

from .conftest import CERT, KEY, TOKEN, shipped_flow
from .inputs import IMAGES, MIN_COSINE, TEXTS, cosines, data_uri, pixels

PROTOCOLS = ('grpc', 'http', 'websocket')


def request_docs() -> DocList[ClipDoc]:
    docs = [ClipDoc(id=f'text-{i}', text=t) for i, t in enumerate(TEXTS)]
    docs += [ClipDoc(id=f'image-{i}', url=data_uri(b)) for i, b in enumerate(IMAGES)]
    docs.append(ClipDoc(id='pixels-0', tensor=pixels(IMAGES[0])))
    return DocList[ClipDoc](docs)


def check_against_v1(out, reference):
    got = {d.id: d.embedding for d in out}
    assert len(got) == len(TEXTS) + len(IMAGES) + 1
    for i in range(len(TEXTS)):
        assert cosines(got[f'text-{i}'], reference['texts'][i]) >= MIN_COSINE
    for i in range(len(IMAGES)):
        assert cosines(got[f'image-{i}'], reference['images'][i]) >= MIN_COSINE
    assert cosines(got['pixels-0'], reference['images'][0]) >= MIN_COSINE


def auth(protocol: str, token: str = TOKEN) -> dict:
    return {'metadata': (('authorization', token),)} if protocol == 'grpc' else {'headers': {'Authorization': token}}


def trust_the_test_certificate():
    """aiohttp (Jina's HTTP and WebSocket clients) makes its verifying SSL context once, when it is first
    imported: where that was before conftest.py pointed SSL_CERT_FILE at the test certificate, make it again."""
    import aiohttp.connector

    aiohttp.connector._SSL_CONTEXT_VERIFIED = aiohttp.connector._make_ssl_context(True)


@pytest.fixture(scope='module')
def secure(export_dir, tmp_path_factory):
    from tests.integration.conftest import free_port, wait_for

    trust_the_test_certificate()

    ports = [free_port() for _ in PROTOCOLS]
    env = {'CLIPSERVE_AUTH_TOKEN': TOKEN, 'CLIPSERVE_TLS_CERT': CERT, 'CLIPSERVE_TLS_KEY': KEY}
    with shipped_flow('secure-v2.yml', tmp_path_factory.mktemp('flows'), export_dir, ports, env):
        url = f'https://localhost:{ports[1]}'
        wait_for(lambda: requests.get(f'{url}/readyz', timeout=5).status_code == 200, 60, 'both replicas ready')
        yield dict(zip(PROTOCOLS, ports), url=url)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_tls_token_and_replicas_give_the_v1_flows_embeddings(secure, reference, protocol):
    client = Client(host='localhost', port=secure[protocol], protocol=protocol, tls=True)
    out = client.post('/encode', request_docs(), return_type=DocList[ClipDoc], request_size=3, **auth(protocol))
    check_against_v1(out, reference)


def test_both_replicas_serve(secure):
    client = Client(host='localhost', port=secure['grpc'], protocol='grpc', tls=True)
    pids = set()
    for _ in range(8):
        [answer] = client.post('/clipserve/info', DocList[ClipDoc]([ClipDoc()]), return_responses=True, **auth('grpc'))
        pids |= {info['pid'] for info in answer.parameters['__results__'].values()}
    assert len(pids) == 2, pids


def test_no_token_no_answer_on_any_protocol(secure):
    with pytest.raises(Exception, match='UNAUTHENTICATED'):
        Client(host='localhost', port=secure['grpc'], protocol='grpc', tls=True).post(
            '/encode', DocList[ClipDoc]([ClipDoc(text='x')]), **auth('grpc', 'wrong')
        )
    reply = requests.post(f'{secure["url"]}/encode', json={'data': [{'text': 'x'}]}, timeout=30)
    assert reply.status_code == 401
    with pytest.raises((BadServer, ConnectionError, Exception)):
        Client(host='localhost', port=secure['websocket'], protocol='websocket', tls=True).post(
            '/encode', DocList[ClipDoc]([ClipDoc(text='x')]), return_type=DocList[ClipDoc]
        )


def test_clients_that_do_not_trust_the_certificate_are_refused(secure):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f'{secure["url"]}/readyz', verify='/etc/ssl/certs/ca-certificates.crt', timeout=10)


def test_the_openai_routes_work_as_in_v1(secure, reference):
    headers = {'Authorization': f'Bearer {TOKEN}'}
    models = requests.get(f'{secure["url"]}/v1/models', headers=headers, timeout=30).json()
    assert [m['id'] for m in models['data']] == ['clipserve-tiny::random']
    body = {'model': 'clipserve-tiny::random', 'input': [TEXTS[0], {'image': data_uri(IMAGES[1])}]}
    reply = requests.post(f'{secure["url"]}/v1/embeddings', json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text[:2000]
    rows = [np.asarray(d['embedding']) for d in reply.json()['data']]
    assert cosines(rows[0], reference['texts'][0]) >= MIN_COSINE
    assert cosines(rows[1], reference['images'][1]) >= MIN_COSINE
    assert reply.json()['usage']['prompt_tokens'] > 0
    body = {'model': 'clipserve-tiny::random', 'query': TEXTS[0], 'documents': [TEXTS[1], TEXTS[0]]}
    reply = requests.post(f'{secure["url"]}/v1/rank', json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text[:2000]
    results = reply.json()['results']
    assert [r['index'] for r in results] == [1, 0]
    assert results[1]['clip_score_cosine'] == pytest.approx(
        cosines(reference['texts'][0], reference['texts'][1]), abs=1e-5
    )
    assert requests.get(f'{secure["url"]}/v1/models', timeout=30).status_code == 401


@pytest.fixture(scope='module')
def sharded(export_dir, tmp_path_factory):
    from tests.integration.conftest import free_port, wait_for

    ports = [free_port() for _ in PROTOCOLS]
    with shipped_flow('shards-v2.yml', tmp_path_factory.mktemp('flows'), export_dir, ports):
        url = f'http://127.0.0.1:{ports[1]}'
        wait_for(lambda: requests.get(f'{url}/readyz', timeout=5).status_code == 200, 60, 'both shards ready')
        yield dict(zip(PROTOCOLS, ports), url=url)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_shards_give_the_v1_flows_embeddings_in_order(sharded, reference, protocol):
    client = Client(host='127.0.0.1', port=sharded[protocol], protocol=protocol)
    out = client.post('/encode', request_docs(), return_type=DocList[ClipDoc], request_size=2, results_in_order=True)
    assert [d.id for d in out] == [d.id for d in request_docs()]
    check_against_v1(out, reference)
    query = ClipQuery(text=TEXTS[0], matches=DocList[ClipMatch]([ClipMatch(text=TEXTS[1]), ClipMatch(text=TEXTS[0])]))
    [ranked] = client.post('/rank', DocList[ClipQuery]([query]), return_type=DocList[ClipQuery])
    assert [m.text for m in ranked.matches] == [TEXTS[0], TEXTS[1]]


def test_readiness_asks_every_shard(sharded):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f'127.0.0.1:{sharded["grpc"]}') as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service='readiness'), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    [response] = Client(host='127.0.0.1', port=sharded['grpc']).post(
        '/clipserve/info', DocList[ClipDoc]([ClipDoc()]), return_responses=True
    )
    assert len({info['pid'] for info in response.parameters['__results__'].values()}) == 2
