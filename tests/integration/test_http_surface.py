"""The HTTP port explains itself: `/openapi.json` (and so `/docs`) lists every clipserve route with its schemas,
and real requests and answers of each route validate against them (jsonschema), errors included; `GET /` says
what the server is; `/health` is the readiness; `/metrics` serves the gateway's Prometheus metrics where the
Flow has monitoring on, and says how to turn it on where not; a gateway open to every address without a token
says so at start, one that is not stays quiet.

flows/search-rerank.yml (tiny CLIP model, an index, a tiny cross-encoder) with monitoring on, and
flows/multi-protocol.yml as shipped: both run as operators run them (`jina flow --uses`, FlowProcess)."""

from __future__ import annotations

import jsonschema
import pytest
import requests
import yaml

from ..transformers_folders import cross_encoder_checkpoint
from .conftest import ROOT, TINY, FlowProcess, data_uri, free_port, make_image

pytest.importorskip('transformers')


@pytest.fixture(scope='module')
def full(tmp_path_factory):
    """Every route: encoder, index and reranker; monitoring on."""
    folder = tmp_path_factory.mktemp('http-surface')
    config = yaml.safe_load((ROOT / 'flows' / 'search-rerank.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    config['with'] = {'monitoring': True, 'port_monitoring': free_port()}
    checkpoint = cross_encoder_checkpoint(folder / 'reranker')
    env = {
        'CLIPSERVE_MODEL': TINY,
        'CLIPSERVE_RERANK_MODEL': str(checkpoint),
        'CLIPSERVE_INDEX_PATH': str(folder / 'i'),
    }
    with FlowProcess(config, folder / 'flow', env) as flow:
        url = f'http://127.0.0.1:{ports[1]}'
        from clip_client import Client
        from docarray import Document

        Client(f'grpc://127.0.0.1:{ports[0]}').index([Document(text=f'caption {i}', tags={'i': i}) for i in range(20)])
        yield {'url': url, 'flow': flow, 'schema': requests.get(f'{url}/openapi.json', timeout=30).json()}


@pytest.fixture(scope='module')
def plain(tmp_path_factory):
    """flows/multi-protocol.yml as shipped: no monitoring, no index, every address, no token."""
    folder = tmp_path_factory.mktemp('http-plain')
    config = yaml.safe_load((ROOT / 'flows' / 'multi-protocol.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    with FlowProcess(config, folder, {'CLIPSERVE_MODEL': TINY}) as flow:
        yield {'url': f'http://127.0.0.1:{ports[1]}', 'flow': flow}


def validate(schema: dict, component: str, instance) -> None:
    """`instance` against the OpenAPI document's component `component` (its $refs resolved in the document)."""
    wrapper = {**schema, '$ref': f'#/components/schemas/{component}'}
    jsonschema.validate(instance, wrapper, cls=jsonschema.Draft202012Validator)


def exchange(full, path: str, body: dict, request_schema: str, answer_schema: str) -> dict:
    validate(full['schema'], request_schema, body)
    answer = requests.post(f'{full["url"]}{path}', json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    validate(full['schema'], answer_schema, answer.json())
    return answer.json()


def test_openapi_lists_every_route_with_its_schemas(full):
    paths = full['schema']['paths']
    for path in ('/v1/embeddings', '/v1/rank', '/v1/search', '/v1/rerank', '/rerank', '/v2/rerank'):
        body = paths[path]['post']['requestBody']['content']['application/json']['schema']
        assert body['$ref'].startswith('#/components/schemas/')
        assert {'200', '400', '401', '429', '503'} <= set(paths[path]['post']['responses'])
    for path in ('/', '/v1/models', '/readyz', '/health', '/livez', '/metrics', '/playground'):
        assert 'get' in paths[path], path
    assert '/post' in paths  # Jina's own routes stay listed
    assert full['schema']['info']['title'] == 'clipserve'
    jsonschema.Draft202012Validator.check_schema({'$defs': full['schema']['components']['schemas']})
    docs = requests.get(f'{full["url"]}/docs', timeout=30)
    assert docs.status_code == 200 and '/openapi.json' in docs.text


def test_real_requests_and_answers_match_the_schemas(full):
    image = data_uri(make_image(48, 40, seed=3))
    exchange(full, '/v1/embeddings', {'input': ['a dog', {'image': image}]}, 'EmbeddingsRequest', 'EmbeddingsResponse')
    exchange(
        full,
        '/v1/embeddings',
        {'input': 'a dog', 'encoding_format': 'base64', 'model': TINY},
        'EmbeddingsRequest',
        'EmbeddingsResponse',
    )
    exchange(full, '/v1/rank', {'query': 'a dog', 'documents': ['a', {'image': image}]}, 'RankRequest', 'RankResponse')
    found = exchange(
        full,
        '/v1/search',
        {'query': 'caption 3', 'top_k': 5, 'filter': {'i': {'$lt': 10}}, 'rerank': {'top_n': 3}},
        'SearchRequest',
        'SearchResponse',
    )
    assert len(found['results']) == 3 and all(r['tags']['i'] < 10 and 'rerank_score' in r for r in found['results'])
    exchange(
        full,
        '/v1/rerank',
        {'query': 'a', 'documents': ['b', {'text': 'c'}], 'top_n': 1},
        'RerankRequest',
        'RerankResponse',
    )
    exchange(
        full, '/rerank', {'query': 'a', 'texts': ['b', 'c'], 'raw_scores': True}, 'RerankRequest', 'RerankResponse'
    )
    exchange(full, '/v2/rerank', {'query': 'a', 'documents': ['b'], 'model': 'any'}, 'RerankRequest', 'RerankResponse')
    for path, bad_body in (('/v1/embeddings', {'input': []}), ('/v1/rerank', {'query': 'a', 'documents': 'b'})):
        with pytest.raises(jsonschema.ValidationError):  # the schema refuses what the route refuses
            validate(full['schema'], 'EmbeddingsRequest' if 'embed' in path else 'RerankRequest', bad_body)
        bad = requests.post(f'{full["url"]}{path}', json=bad_body, timeout=60)
        assert bad.status_code == 400
        validate(full['schema'], 'Error', bad.json())
    models = requests.get(f'{full["url"]}/v1/models', timeout=60).json()
    validate(full['schema'], 'ModelList', models)
    assert models['capabilities']['search'] is True and len(models['capabilities']['rerankers']) == 1


def test_the_index_says_what_the_server_is(full, plain):
    from clipserve import __version__

    index = requests.get(f'{full["url"]}/', timeout=30).json()
    validate(full['schema'], 'Index', index)
    assert (index['name'], index['version'], index['ready'], index['models']) == (
        'clipserve',
        __version__,
        True,
        [TINY],
    )
    assert {'docs', 'openapi', 'health', 'metrics', 'models', 'embeddings', 'search', 'playground'} <= set(
        index['links']
    )
    for link in ('/openapi.json', '/health', '/v1/models', '/playground'):
        assert requests.get(f'{full["url"]}{link}', timeout=30).status_code == 200, link
    assert requests.get(f'{plain["url"]}/', timeout=30).json()['models'] == [TINY]


def test_health_is_the_readiness(full):
    answer = requests.get(f'{full["url"]}/health', timeout=30)
    assert (answer.status_code, answer.json()) == (200, {'status': 'ready'})
    assert requests.head(f'{full["url"]}/health', timeout=30).status_code == 200


def test_metrics_are_served_where_monitoring_is_on(full, plain):
    requests.post(f'{full["url"]}/v1/embeddings', json={'input': 'counted'}, timeout=60)
    metrics = requests.get(f'{full["url"]}/metrics', timeout=30)
    assert metrics.status_code == 200 and metrics.headers['content-type'].startswith('text/plain')
    assert 'clipserve_openai_requests_total{' in metrics.text and 'route="embeddings"' in metrics.text
    off = requests.get(f'{plain["url"]}/metrics', timeout=30)
    assert off.status_code == 404 and off.json()['error']['code'] == 'monitoring_off'
    assert 'monitoring' in off.json()['error']['message']


def test_an_open_gateway_says_so_at_start(plain):
    assert 'OPEN: the gateway listens on every address' in plain['flow'].log()
    assert 'asks no token' in plain['flow'].log()


def test_a_gateway_on_loopback_or_with_a_token_stays_quiet():
    from clipserve.serving.gateway.gateways import open_to_all

    assert open_to_all('127.0.0.1', None, [1]) is None and open_to_all('0.0.0.0', 'secret', [1]) is None
    assert 'every address (ports 51000, 51001)' in open_to_all(None, None, [51000, 51001])
    assert 'listens on 10.0.0.5' in open_to_all('10.0.0.5', '', 8080)
