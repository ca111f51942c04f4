"""flows/onnx.yml against flows/torch.yml on the same ViT-B-32::random weights, through clip-client."""

import pytest
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from .conftest import flow_from_yaml, free_port, make_image, set_port
from .served_pair import assert_flow_equals_torch_flow

MODEL = 'ViT-B-32::random'


@pytest.fixture(scope='module')
def servers(tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    exported = tmp_path_factory.mktemp('vit-b-32-onnx')
    export_onnx(MODEL, exported)
    torch_port, onnx_port = free_port(), free_port()
    folder = tmp_path_factory.mktemp('flows')
    torch_flow = flow_from_yaml('torch.yml', folder, lambda c: set_port(c, torch_port), {'CLIPSERVE_MODEL': MODEL})
    onnx_flow = flow_from_yaml(
        'onnx.yml',
        folder,
        lambda c: set_port(c, onnx_port),
        {'CLIPSERVE_MODEL': MODEL, 'CLIPSERVE_MODEL_PATH': str(exported)},
    )
    with torch_flow, onnx_flow:
        yield {'torch': torch_port, 'onnx': onnx_port}


def test_onnx_flow_equals_torch_flow(servers):
    assert_flow_equals_torch_flow(servers, 'onnx', MODEL, 512)


def test_rank_through_the_onnx_flow(servers):
    client = Client(f'grpc://127.0.0.1:{servers["onnx"]}')
    query = Document(blob=make_image(seed=3), matches=[Document(text=t) for t in ('a dog', 'a cat', 'a car')])
    out = client.rank(DocumentArray([query]))
    scores = [m.scores['clip_score'].value for m in out[0].matches]
    assert abs(sum(scores) - 1) < 1e-6 and scores == sorted(scores, reverse=True)


def test_onnx_executor_process_never_imported_torch(servers):
    responses = JinaClient(host='127.0.0.1', port=servers['onnx']).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    results = responses[0].parameters['__results__']
    info = next(v for k, v in results.items() if k.startswith('clip_o'))
    assert info['backend'] == 'onnx' and info['model'] == MODEL
    assert info['torch_imported'] is False
