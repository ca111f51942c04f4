"""flows/openvino.yml against flows/torch.yml on the same weights at fp32, through clip-client: encode, /rank,
and a replica that never imported torch."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

if not os.environ.get('CI'):  # CI installs the test extra, which has openvino: there a missing one fails
    # (through clipserve's module, which imports OpenVINO without its telemetry)
    pytest.importorskip(
        'clipserve.backends.openvino.runtime', reason='openvino is not installed (pip install -e ".[openvino]")'
    )

from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from .conftest import TINY, flow_from_yaml, free_port, make_image, set_port
from .served_pair import assert_flow_equals_torch_flow

MODEL = TINY


@pytest.fixture(scope='module')
def servers(tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    exported = tmp_path_factory.mktemp('tiny-onnx')
    export_onnx(MODEL, exported)
    ports = {'torch': free_port(), 'openvino': free_port()}
    folder = tmp_path_factory.mktemp('flows')
    env = {'CLIPSERVE_MODEL': MODEL, 'CLIPSERVE_DTYPE': 'fp32'}
    flows = [
        flow_from_yaml('torch.yml', folder, lambda c: set_port(c, ports['torch']), env),
        flow_from_yaml(
            'openvino.yml',
            folder,
            lambda c: set_port(c, ports['openvino']),
            {**env, 'CLIPSERVE_MODEL_PATH': str(exported)},
        ),
    ]
    with ThreadPoolExecutor(2) as starting:  # both Flows start at once: their processes' imports overlap
        list(starting.map(lambda flow: flow.start(), flows))
    try:
        yield ports
    finally:
        for flow in flows:
            flow.close()


def test_openvino_flow_equals_torch_flow(servers):
    assert_flow_equals_torch_flow(servers, 'openvino', f'{MODEL}, fp32', 64)


def test_rank_through_the_openvino_flow_equals_torch(servers):
    query = Document(blob=make_image(seed=3), matches=[Document(text=t) for t in ('a dog', 'a cat', 'a car')])
    ranked = {
        backend: Client(f'grpc://127.0.0.1:{port}').rank(DocumentArray([Document(query, copy=True)]))[0].matches
        for backend, port in servers.items()
    }
    scores = {b: {m.text: m.scores['clip_score'].value for m in matches} for b, matches in ranked.items()}
    assert abs(sum(scores['openvino'].values()) - 1) < 1e-6
    assert [m.text for m in ranked['openvino']] == [m.text for m in ranked['torch']]
    for text, score in scores['torch'].items():
        assert abs(scores['openvino'][text] - score) <= 1e-3


def test_openvino_replica_reports_itself_and_never_imported_torch(servers):
    responses = JinaClient(host='127.0.0.1', port=servers['openvino']).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    results = responses[0].parameters['__results__']
    info = next(v for k, v in results.items() if k.startswith('clip_v'))
    assert info['backend'] == 'openvino' and info['model'] == MODEL and info['device'] == 'cpu'
    assert info['precision'] == {'images': 'fp32', 'texts': 'fp32', 'reason': 'dtype fp32 was asked for'}
    assert info['torch_imported'] is False
