"""/v1/embeddings, /v1/models and /v1/rank through a real Flow, with the official `openai` package as the client.

One Flow for the module: flows/auth.yml (token on every protocol) with the TLS keys of flows/tls.yml on
its gateway (the test's own certificate) and Prometheus metrics on, serving the tiny model. The vectors
are compared with clip-client's (gRPC over the same TLS, with the token), normalised, at 1e-6.
"""

import base64
import concurrent.futures
import http.server
import json
import os
import ssl
import subprocess
import sys
import textwrap
import threading
import urllib.request

import numpy as np
import pytest
import requests

from .conftest import TINY, data_uri, flow_from_yaml, free_port, make_image, set_port

try:
    import openai  # the official SDK, from the `test` extra
except ImportError:  # pragma: no cover (skipped outside CI, a failure in it)
    if os.environ.get('CI', '').lower() == 'true':
        raise
    pytest.skip("the openai package is not installed (the 'test' extra)", allow_module_level=True)

TOKEN = 'openai-route-token'
MAX_IMAGE_BYTES = 60_000  # the encoder's max_image_bytes, small so the cap is cheap to hit
MAX_BODY_BYTES = 1_000_000  # the gateway's max_body_bytes
TEXTS = ['a photo of a dog', 'a diagram of a CLIP model', 'über straße 東京']
IMAGES = [make_image(64, 48, seed=1), make_image(40, 90, seed=2, fmt='JPEG')]


@pytest.fixture(scope='module')
def served(tmp_path_factory, certificate):
    ports = [free_port() for _ in range(3)]
    gateway_metrics, executor_metrics = free_port(), free_port()
    cert, key = certificate

    def edit(config):
        set_port(config, ports)
        config['gateway'].update(ssl_certfile=str(cert), ssl_keyfile=str(key))
        config['gateway']['uses_with']['max_body_bytes'] = MAX_BODY_BYTES
        config['with'] = {'monitoring': True, 'port_monitoring': gateway_metrics}
        executor = config['executors'][0]
        executor.update(monitoring=True, port_monitoring=executor_metrics)
        executor['uses']['with'].update(max_image_bytes=MAX_IMAGE_BYTES, batch_wait_ms=200, minibatch_size=16)

    flow = flow_from_yaml(
        'auth.yml',
        tmp_path_factory.mktemp('flows'),
        edit,
        {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_AUTH_TOKEN': TOKEN},
    )
    os.environ['CLIPSERVE_AUTH_TOKEN'] = TOKEN  # the gateway process reads it when it starts
    try:
        with flow:
            yield {
                'grpc': ports[0],
                'http': ports[1],
                'base_url': f'https://localhost:{ports[1]}/v1',
                'cert': str(cert),
                'gateway_metrics': gateway_metrics,
                'executor_metrics': executor_metrics,
            }
            # a TLS connection still open when the gateway stops holds it up for asyncio's 30 s SSL shutdown
            while CLIENTS:
                CLIENTS.pop().close()
    finally:
        os.environ.pop('CLIPSERVE_AUTH_TOKEN', None)


CLIENTS = []  # closed before the Flow stops


def client(served, api_key=TOKEN, trusted=True):
    context = ssl.create_default_context(cafile=served['cert'] if trusted else None)
    made = openai.OpenAI(
        base_url=served['base_url'],
        api_key=api_key,
        max_retries=0,
        timeout=60,
        http_client=openai.DefaultHttpxClient(verify=context),
    )
    CLIENTS.append(made)
    return made


def post(served, path, body, token=TOKEN):
    headers = {'Authorization': f'Bearer {token}'} if token else {}
    return requests.post(f'{served["base_url"]}{path}', json=body, headers=headers, verify=served['cert'], timeout=60)


def unit(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.fixture(scope='module')
def clip_client_vectors(served, tmp_path_factory):
    """clip-client 0.8.3's embeddings of TEXTS then IMAGES (files), over gRPC with TLS and the token, in a
    fresh process (clip-client's TLS trust comes from environment variables read at start)."""
    folder = tmp_path_factory.mktemp('clip-client')
    paths = []
    for i, data in enumerate(IMAGES):
        path = folder / f'image{i}.{"png" if i == 0 else "jpg"}'
        path.write_bytes(data)
        paths.append(str(path))
    out = folder / 'vectors.npy'
    code = textwrap.dedent(f"""
        import numpy as np
        from clip_client import Client
        c = Client('grpcs://localhost:{served['grpc']}', credential={{'Authorization': {TOKEN!r}}})
        np.save({str(out)!r}, c.encode({TEXTS + paths!r}))
    """)
    env = {**os.environ, 'GRPC_DEFAULT_SSL_ROOTS_FILE_PATH': served['cert'], 'SSL_CERT_FILE': served['cert']}
    result = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out)


# ---- embeddings ---------------------------------------------------------------------------------


def test_texts_with_the_openai_sdk_equal_clip_clients_normalised(served, clip_client_vectors):
    answer = client(served).embeddings.create(model=TINY, input=TEXTS, encoding_format='float', user='someone')
    assert answer.object == 'list' and answer.model == TINY
    assert [d.index for d in answer.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in answer.data])
    assert vectors.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(vectors, unit(clip_client_vectors[: len(TEXTS)]), atol=1e-6)


def test_usage_counts_the_models_tokens(served):
    from clipserve.models.tokenizer import Tokenizer

    answer = client(served).embeddings.create(model=TINY, input=TEXTS + [data_uri(IMAGES[0])])
    expected = int(Tokenizer()(TEXTS).lengths.sum())  # start and end tokens included; images count 0
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected


def test_images_and_mixed_lists_in_every_shape(served, clip_client_vectors):
    b64 = base64.b64encode(IMAGES[1]).decode()
    inputs = [
        data_uri(IMAGES[0]),  # a data: URI string is an image
        TEXTS[0],
        {'image': b64},  # NV-CLIP's / Jina's items; bare base64 where the item says image
        {'text': TEXTS[1]},
        {'type': 'image_url', 'image_url': {'url': data_uri(IMAGES[0])}},
    ]
    # without encoding_format the SDK asks for base64 and decodes it: the base64 path
    answer = client(served).embeddings.create(model=TINY, input=inputs)
    vectors = np.array([d.embedding for d in answer.data])
    reference = unit(clip_client_vectors)
    expected = reference[[3, 0, 4, 1, 3]]  # TEXTS (3) then IMAGES (2) in clip_client_vectors
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    floats = client(served).embeddings.create(model=TINY, input=inputs, encoding_format='float')
    np.testing.assert_array_equal(np.array([d.embedding for d in floats.data], dtype=np.float32), vectors)


def test_base64_answers_are_little_endian_float32(served):
    raw = post(served, '/embeddings', {'model': TINY, 'input': ['a dog'], 'encoding_format': 'base64'}).json()
    floats = post(served, '/embeddings', {'model': TINY, 'input': ['a dog']}).json()
    decoded = np.frombuffer(base64.b64decode(raw['data'][0]['embedding']), dtype='<f4')
    np.testing.assert_array_equal(decoded, np.array(floats['data'][0]['embedding'], dtype=np.float32))


def test_infinitys_modality_field(served):
    url_like = 'https://example.com/this-is-a-caption'
    as_text = post(served, '/embeddings', {'model': TINY, 'input': [url_like], 'modality': 'text'})
    assert as_text.status_code == 200 and as_text.json()['usage']['prompt_tokens'] > 0
    as_image = post(served, '/embeddings', {'model': TINY, 'input': [data_uri(IMAGES[0])], 'modality': 'image'})
    assert as_image.status_code == 200 and as_image.json()['usage']['prompt_tokens'] == 0


# ---- errors -------------------------------------------------------------------------------------


def error_of(call, kind):
    with pytest.raises(kind) as caught:
        call()
    return caught.value


def test_a_corrupt_image_is_a_400_naming_its_index_and_the_gateway_keeps_serving(served):
    c = client(served)
    inputs = ['a dog', data_uri(IMAGES[0]), 'data:image/png;base64,' + base64.b64encode(b'not a png').decode()]
    err = error_of(lambda: c.embeddings.create(model=TINY, input=inputs), openai.BadRequestError)
    assert err.status_code == 400 and err.body['param'] == 'input[2]'
    assert 'input[2]' in err.body['message'] and 'not an image Pillow can decode' in err.body['message']
    # OpenAI's four fields, and `items` (the SDK keeps it in the body): each failed item by its position
    assert err.body['type'] == 'invalid_request_error' and set(err.body) == {
        'message',
        'type',
        'param',
        'code',
        'items',
    }
    [item] = err.body['items']
    assert (item['index'], item['param']) == (2, 'input[2]') and 'not an image Pillow can decode' in item['message']
    assert len(c.embeddings.create(model=TINY, input=inputs[:2]).data) == 2


def test_remote_urls_are_refused_by_index_and_never_fetched(served):
    fetched = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            fetched.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f'http://127.0.0.1:{server.server_address[1]}/cat.png'
        err = error_of(
            lambda: client(served).embeddings.create(model=TINY, input=['a cat', url]), openai.BadRequestError
        )
        assert err.body['param'] == 'input[1]' and 'remote URIs is disabled' in err.body['message']
        assert fetched == []
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    'kwargs, param, words',
    [
        ({'input': ['ok', '']}, 'input[1]', 'empty text'),
        ({'input': [[1, 2, 3]]}, 'input[0]', 'token id arrays are not supported'),
        ({'input': [{'text': 'a', 'image': 'b'}]}, 'input[0]', 'exactly one of'),
        ({'input': 'a', 'dimensions': 32}, 'dimensions', 'not trained to be truncated'),
        ({'input': 'a', 'encoding_format': 'int8'}, 'encoding_format', 'float, base64'),
    ],
)
def test_bad_requests_are_openai_400s(served, kwargs, param, words):
    err = error_of(lambda: client(served).embeddings.create(model=TINY, **kwargs), openai.BadRequestError)
    assert err.body['param'] == param and words in err.body['message'], err.body


def test_an_unknown_model_is_a_404_listing_the_served_ones(served):
    err = error_of(
        lambda: client(served).embeddings.create(model='text-embedding-3-small', input='a'), openai.NotFoundError
    )
    assert err.body['code'] == 'model_not_found' and TINY in err.body['message']


def test_the_size_caps_are_413s(served):
    big = make_image(200, 200, seed=3)  # noisy PNG, over MAX_IMAGE_BYTES, under the request cap
    assert MAX_IMAGE_BYTES < len(big) < MAX_BODY_BYTES // 2
    err = error_of(
        lambda: client(served).embeddings.create(model=TINY, input=['a', data_uri(big)]), openai.APIStatusError
    )
    assert err.status_code == 413 and err.body['param'] == 'input[1]' and str(MAX_IMAGE_BYTES) in err.body['message']
    err = error_of(
        lambda: client(served).embeddings.create(model=TINY, input=['x' * MAX_BODY_BYTES]), openai.APIStatusError
    )
    assert err.status_code == 413 and 'max_body_bytes' in err.body['message']
    assert client(served).embeddings.create(model=TINY, input='still serving').data


def test_the_token_is_required_on_every_route(served):
    err = error_of(
        lambda: client(served, api_key='wrong').embeddings.create(model=TINY, input='a'), openai.AuthenticationError
    )
    assert err.status_code == 401 and err.body['code'] == 'invalid_api_key'
    for path in ('/models', '/embeddings', '/rank', '/search', '/nothing-here'):
        reply = requests.request(
            'GET' if path == '/models' else 'POST',
            f'{served["base_url"]}{path}',
            json={},
            verify=served['cert'],
            timeout=30,
        )
        assert reply.status_code == 401 and reply.json()['error']['code'] == 'invalid_api_key'
    assert error_of(lambda: client(served, api_key='wrong').models.list(), openai.AuthenticationError)


def test_tls_clients_that_do_not_trust_the_certificate_are_refused(served):
    error_of(lambda: client(served, trusted=False).embeddings.create(model=TINY, input='a'), openai.APIConnectionError)


# ---- models and rank ----------------------------------------------------------------------------


def test_models_lists_the_served_model_with_its_size_and_modalities(served):
    assert [m.id for m in client(served).models.list()] == [TINY]
    reply = requests.get(
        f'{served["base_url"]}/models', headers={'Authorization': f'Bearer {TOKEN}'}, verify=served['cert'], timeout=30
    )
    [model] = reply.json()['data']
    assert model['embedding_dimensions'] == 64 and model['modalities'] == ['text', 'image'] and model['default']


def test_rank_scores_as_rank_does(served):
    documents = [TEXTS[0], data_uri(IMAGES[1]), {'text': TEXTS[1]}]
    answer = post(served, '/rank', {'model': TINY, 'query': data_uri(IMAGES[0]), 'documents': documents}).json()
    results = answer['results']
    assert sorted(r['index'] for r in results) == [0, 1, 2] and answer['usage']['prompt_tokens'] > 0
    assert [r['clip_score'] for r in results] == sorted((r['clip_score'] for r in results), reverse=True)
    # /rank over Jina's HTTP API, the same query and documents
    body = {
        'execEndpoint': '/rank',
        'data': [
            {
                'uri': data_uri(IMAGES[0]),
                'matches': [{'text': TEXTS[0]}, {'uri': data_uri(IMAGES[1])}, {'text': TEXTS[1]}],
            }
        ],
    }
    reply = requests.post(
        f'https://localhost:{served["http"]}/post',
        json=body,
        headers={'Authorization': TOKEN},
        verify=served['cert'],
        timeout=60,
    ).json()
    matches = reply['data'][0]['matches']
    by_content = {(m.get('text') or 'image'): m['scores'] for m in matches}
    names = [TEXTS[0], 'image', TEXTS[1]]
    for r in results:
        scores = by_content[names[r['index']]]
        assert abs(r['clip_score'] - scores['clip_score']['value']) < 1e-6
        assert abs(r['clip_score_cosine'] - scores['clip_score_cosine']['value']) < 1e-6
        assert r['relevance_score'] == r['clip_score']
    # the cosine is the one of the normalised /v1/embeddings vectors
    vectors = client(served).embeddings.create(model=TINY, input=[data_uri(IMAGES[0]), *documents]).data
    query, *candidates = [np.array(v.embedding, dtype=np.float64) for v in vectors]
    for r in results:
        assert abs(r['clip_score_cosine'] - float(candidates[r['index']] @ query)) < 1e-5
    top = post(served, '/rank', {'model': TINY, 'query': 'q', 'documents': ['a', 'b', 'c'], 'top_n': 2}).json()
    assert len(top['results']) == 2
    bad = post(served, '/rank', {'model': TINY, 'query': 'q', 'documents': ['a', 'data:image/png;base64,AAAA']})
    assert bad.status_code == 400 and bad.json()['error']['param'] == 'documents[1]'


# ---- one code path: dynamic batching and metrics ------------------------------------------------


def _info(served):
    reply = requests.post(
        f'https://localhost:{served["http"]}/post',
        json={'execEndpoint': '/clipserve/info', 'data': [{}]},
        headers={'Authorization': TOKEN},
        verify=served['cert'],
        timeout=60,
    ).json()
    return next(iter(reply['parameters']['__results__'].values()))


def test_concurrent_requests_share_forward_passes_and_the_metrics_count_them(served):
    bad = post(served, '/embeddings', {'model': TINY, 'input': ['ok', 'data:image/png;base64,AAAA']})
    assert bad.status_code == 400  # counted below
    before = _info(served)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: post(served, '/embeddings', {'model': TINY, 'input': f'text {i}'}), range(8)))
    assert all(a.status_code == 200 for a in answers)
    after = _info(served)
    assert after['texts_encoded'] - before['texts_encoded'] == 8
    assert after['model_calls'] - before['model_calls'] < 8, 'dynamic batching merged none of 8 concurrent requests'
    passes = {key: after['passes']['texts'][key] - before['passes']['texts'][key] for key in after['passes']['texts']}
    assert passes['rows'] == 8 and passes['passes'] == after['model_calls'] - before['model_calls']
    assert passes['seconds'] > 0
    gateway = urllib.request.urlopen(f'http://127.0.0.1:{served["gateway_metrics"]}/', timeout=10).read().decode()
    assert 'clipserve_openai_requests_total{route="embeddings",status="200"}' in gateway
    assert 'clipserve_openai_requests_total{route="embeddings",status="400"}' in gateway
    assert 'clipserve_openai_items_total{modality="image",route="embeddings"}' in gateway
    executor = urllib.request.urlopen(f'http://127.0.0.1:{served["executor_metrics"]}/', timeout=10).read().decode()
    assert 'clipserve_docs_per_request_count{' in executor and 'endpoint="encode"' in executor
    assert json.dumps('invalid_document')[1:-1] in executor  # the corrupt image's error, counted by cause


def test_search_without_an_index_is_a_404_saying_which_flow_has_one(served):
    reply = post(served, '/search', {'query': 'a dog'})
    assert reply.status_code == 404 and reply.json()['error']['code'] == 'no_index'
    assert 'flows/search.yml' in reply.json()['error']['message']
