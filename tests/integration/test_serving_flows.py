"""The serving surface from the shipped YAMLs: TLS on every protocol, replicas, shards, monitoring, several models."""

import os
import re
import subprocess
import sys
import textwrap
import urllib.request

import pytest
import requests
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient
from jina.excepts import BadServer

from ..compare import assert_close
from .conftest import TINY, flow_from_yaml, free_port, health, set_port, wait_for

TEXTS = [f'caption number {i}' for i in range(24)]


def reference(texts):
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.models.tokenizer import Tokenizer

    backend = create_backend('torch', TINY, BackendOptions(device='cpu'))
    tokens = Tokenizer()(texts)
    return backend.encode_texts(tokens.input_ids, tokens.attention_mask)


def info(port, endpoint='/clipserve/info'):
    responses = JinaClient(host='127.0.0.1', port=port).post(
        endpoint, DocumentArray([Document()]), return_responses=True
    )
    return responses[0].parameters['__results__']


# ---- TLS ---------------------------------------------------------------------------------


def clip_client_in_subprocess(url, ca_file=None):
    """clip-client in a fresh process: trust for TLS comes from environment variables read at start."""
    env = {**os.environ, 'NO_VERSION_CHECK': '1'}
    if ca_file:  # the build machines point both at the system bundle; the test certificate must win
        env.update(GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(ca_file), SSL_CERT_FILE=str(ca_file))
    code = textwrap.dedent(f"""
        from clip_client import Client
        out = Client({url!r}).encode(['a photo of a dog', 'over tls'])
        print('SHAPE', out.shape, out.dtype)
    """)
    return subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('scheme, protocol', [('grpcs', 'grpc'), ('wss', 'websocket')])
def test_clip_client_over_tls(tls_flow, certificate, scheme, protocol):
    result = clip_client_in_subprocess(f'{scheme}://localhost:{tls_flow[protocol]}', ca_file=certificate[0])
    assert 'SHAPE (2, 64) float32' in result.stdout, result.stderr[-2000:]


def test_https_json(tls_flow, certificate):
    url = f'https://localhost:{tls_flow["http"]}/post'
    reply = requests.post(
        url, json={'execEndpoint': '/', 'data': [{'text': 'hello'}]}, verify=str(certificate[0]), timeout=60
    )
    assert len(reply.json()['data'][0]['embedding']) == 64


def test_clients_that_do_not_trust_the_certificate_are_refused(tls_flow):
    with pytest.raises(requests.exceptions.SSLError):
        requests.post(f'https://localhost:{tls_flow["http"]}/post', json={'data': [{'text': 'x'}]}, timeout=30)
    result = clip_client_in_subprocess(f'grpcs://localhost:{tls_flow["grpc"]}')
    assert result.returncode != 0 and 'SHAPE' not in result.stdout


# ---- replicas and shards -------------------------------------------------------------------


def _scaled_flow(name, tmp_path_factory):
    port = free_port()
    return flow_from_yaml(
        name, tmp_path_factory.mktemp('flows'), lambda c: set_port(c, port), {'CLIPSERVE_MODEL': TINY}
    ), port


@pytest.mark.parametrize('name', ['replicas.yml', 'shards.yml'])
def test_scaled_flows_return_correct_embeddings_in_order(name, tmp_path_factory):
    flow, port = _scaled_flow(name, tmp_path_factory)
    with flow:
        # Jina may call a sharded Flow started before every shard listens; the readiness signal waits for all
        wait_for(lambda: health(port) == 'SERVING', 60, 'every shard and replica to be ready')
        docs = DocumentArray([Document(id=str(i), text=t) for i, t in enumerate(TEXTS)])
        out = JinaClient(host='127.0.0.1', port=port).post('/', docs, request_size=2, results_in_order=True)
        assert [d.id for d in out] == [str(i) for i in range(len(TEXTS))]
        assert_close(out.embeddings, reference(TEXTS), rel=1e-5)
        via_clip_client = Client(f'grpc://127.0.0.1:{port}').encode(TEXTS, batch_size=3)
        assert_close(via_clip_client, reference(TEXTS), rel=1e-5)
        if name == 'replicas.yml':
            pids = {next(iter(info(port).values()))['pid'] for _ in range(8)}
            assert len(pids) == 2, 'both replicas should serve'
        else:
            answers = info(port)  # polling ALL: every shard answers
            assert len({a['pid'] for a in answers.values()}) == 2, answers


# ---- monitoring ---------------------------------------------------------------------------


def test_prometheus_serves_clipserve_metrics(tmp_path_factory):
    port, gateway_metrics, executor_metrics = free_port(), free_port(), free_port()

    def edit(config):
        set_port(config, port)
        config['with']['port_monitoring'] = gateway_metrics
        config['executors'][0]['port_monitoring'] = executor_metrics

    with flow_from_yaml('monitoring.yml', tmp_path_factory.mktemp('flows'), edit, {'CLIPSERVE_MODEL': TINY}):
        Client(f'grpc://127.0.0.1:{port}').encode(['hello', 'world'])
        with pytest.raises(BadServer):
            JinaClient(host='127.0.0.1', port=port).post('/', DocumentArray([Document(id='bad', blob=b'xx')]))
        metrics = urllib.request.urlopen(f'http://127.0.0.1:{executor_metrics}/', timeout=10).read().decode()
        for name in (
            'clipserve_preprocess_seconds',
            'clipserve_inference_seconds',
            'clipserve_docs_per_request',
            'clipserve_errors_total',
            'clipserve_pass_rows',
            'clipserve_model_busy_seconds_total',
        ):
            assert name in metrics, name
        assert 'cause="invalid_document"' in metrics
        # the two texts ran in one pass (after the warm-up's one text): 2 passes, 3 rows by now
        assert re.search(r'clipserve_pass_rows_count\{[^}]*modality="texts"[^}]*\} 2\.0', metrics), metrics
        assert re.search(r'clipserve_pass_rows_sum\{[^}]*modality="texts"[^}]*\} 3\.0', metrics)
        assert 'modality="text"' in metrics
        gateway = urllib.request.urlopen(f'http://127.0.0.1:{gateway_metrics}/', timeout=10).read().decode()
        assert 'jina_' in gateway


# ---- several models behind one gateway ----------------------------------------------------

SMALL, LARGE = TINY, 'ViT-B-32::random'


@pytest.fixture(scope='module')
def multi_model(tmp_path_factory):
    port = free_port()

    def edit(config):
        set_port(config, [port, free_port()])  # gRPC, HTTP
        for executor, model in zip(config['executors'], (SMALL, LARGE)):
            executor['uses']['with']['name'] = model
            executor['uses']['with']['served_models'] = [SMALL, LARGE]

    with flow_from_yaml('multi-model.yml', tmp_path_factory.mktemp('flows'), edit):
        yield port


def _counts(port):
    return {k.split('/')[0]: v['texts_encoded'] for k, v in info(port).items()}


def test_model_name_routes_to_that_model_only(multi_model):
    client = Client(f'grpc://127.0.0.1:{multi_model}')
    before = _counts(multi_model)
    large = client.encode(['a dog', 'a cat', 'a car'], parameters={'model_name': LARGE})
    middle = _counts(multi_model)
    small = client.encode(['a dog', 'a cat'], parameters={'model_name': SMALL})
    default = client.encode(['a dog'])
    after = _counts(multi_model)
    assert large.shape == (3, 512) and small.shape == (2, 64) and default.shape == (1, 64)
    assert_close(small[0], default[0], rel=1e-5)  # one batch of two vs alone
    assert middle['clip_large'] - before['clip_large'] == 3 and middle['clip_default'] == before['clip_default']
    assert after['clip_default'] - middle['clip_default'] == 3 and after['clip_large'] == middle['clip_large']


def test_rank_with_model_name(multi_model):
    query = Document(text='a dog', matches=[Document(text='dog'), Document(text='cat')])
    out = Client(f'grpc://127.0.0.1:{multi_model}').rank(DocumentArray([query]), parameters={'model_name': LARGE})
    assert abs(sum(m.scores['clip_score'].value for m in out[0].matches) - 1) < 1e-6


def test_unknown_model_lists_the_served_ones(multi_model):
    with pytest.raises(BadServer) as err:
        JinaClient(host='127.0.0.1', port=multi_model).post(
            '/encode/ViT-H-14::laion2b_s32b_b79k', DocumentArray([Document(text='x')])
        )
    assert 'ViT-H-14' in str(err.value) and SMALL in str(err.value) and LARGE in str(err.value)
