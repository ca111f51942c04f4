"""CLIPEncoder through a real Flow, called by the real clip-client 0.8.3 and by jina's own client."""

import importlib.util

import numpy as np
import pytest
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient
from PIL import Image

from ..compare import assert_close
from .conftest import data_uri, make_image

PROTOCOLS = ['grpc', 'websocket']


def clip_client(ports, protocol):
    scheme = {'grpc': 'grpc', 'websocket': 'ws', 'http': 'http'}[protocol]
    return Client(f'{scheme}://127.0.0.1:{ports[protocol]}')


def jina_client(ports, protocol='grpc'):
    return JinaClient(host='127.0.0.1', port=ports[protocol], protocol=protocol)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_encode_strings_gives_an_array(tiny_flow, protocol):
    texts = ['a photo of a dog', 'a photo of a cat', 'hello world']
    out = clip_client(tiny_flow, protocol).encode(texts)
    assert isinstance(out, np.ndarray) and out.shape == (3, 64) and out.dtype == np.float32
    assert not np.allclose(out[0], out[1])


def _image_docs(n):
    kinds = []
    for i in range(n):
        png = make_image(seed=i)
        kind = i % 3
        if kind == 0:
            doc = Document(id=str(i), blob=png)
        elif kind == 1:
            doc = Document(id=str(i), tensor=np.asarray(Image.open(__import__('io').BytesIO(png))))
        else:
            doc = Document(id=str(i), uri=data_uri(png))
        kinds.append(doc)
    return DocumentArray(kinds)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_documents_keep_identity_and_order(tiny_flow, protocol):
    docs = _image_docs(20)
    originals = list(docs)
    out = clip_client(tiny_flow, protocol).encode(docs, batch_size=1)
    assert [d.id for d in out] == [str(i) for i in range(20)]
    assert all(a is b for a, b in zip(out, originals))
    assert all(d.embedding is not None and d.embedding.shape == (64,) for d in out)
    # clip-client copies back only embeddings: the caller's own content stays as it was
    assert all(d.tensor is not None for d in out[1::3]) and all(d.blob for d in out[0::3])


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_same_image_as_blob_tensor_and_data_uri_gives_same_embedding(tiny_flow, protocol):
    png = make_image(80, 60, seed=7)
    tensor = np.asarray(Image.open(__import__('io').BytesIO(png)))
    docs = DocumentArray([Document(blob=png), Document(tensor=tensor), Document(uri=data_uri(png))])
    out = clip_client(tiny_flow, protocol).encode(docs)
    assert_close(out[0].embedding, out[1].embedding, rel=1e-6)
    assert_close(out[0].embedding, out[2].embedding, rel=1e-6)


def test_text_and_image_strings_from_clip_client(tiny_flow, tmp_path):
    path = tmp_path / 'dog.jpg'
    path.write_bytes(make_image(120, 90, fmt='JPEG'))
    out = clip_client(tiny_flow, 'grpc').encode(['a photo of a dog', str(path)])
    assert out.shape == (2, 64) and out.dtype == np.float32


@pytest.mark.parametrize('endpoint', ['/', '/encode', '/encode/clipserve-tiny::random', '/index', '/search', '/foo'])
def test_every_unbound_endpoint_encodes(tiny_flow, endpoint):
    out = jina_client(tiny_flow).post(endpoint, DocumentArray([Document(text='hi')]), parameters={'limit': 3})
    assert out[0].embedding.shape == (64,)
    # clip-as-service set mime_type 'text', which docarray v1 itself normalises to 'text/plain'
    assert out[0].mime_type == Document(mime_type='text').mime_type == 'text/plain'


def test_text_wins_over_image_and_content_is_kept(tiny_flow):
    png = make_image()
    docs = DocumentArray([Document(text='hello', uri=data_uri(png)), Document(text='hello')])
    out = jina_client(tiny_flow).post('/', docs)
    assert_close(out[0].embedding, out[1].embedding, rel=1e-6)
    assert out[0].uri == data_uri(png)


def test_drop_image_content_default_false_on_server(tiny_flow):
    png = make_image()
    out = jina_client(tiny_flow).post('/', DocumentArray([Document(blob=png)]))
    assert out[0].blob == png and out[0].embedding is not None
    out = jina_client(tiny_flow).post(
        '/', DocumentArray([Document(blob=png, uri='x')]), parameters={'drop_image_content': True}
    )
    assert not out[0].blob and out[0].uri == 'x'


@pytest.mark.parametrize('key', ['access_paths', 'traversal_paths'])
def test_access_paths_select_chunks(tiny_flow, key):
    root = Document(chunks=[Document(text='a'), Document(blob=make_image())])
    out = jina_client(tiny_flow).post('/', DocumentArray([root]), parameters={key: '@c', 'drop_image_content': True})
    assert out[0].embedding is None
    assert all(c.embedding is not None for c in out[0].chunks)
    assert not out[0].chunks[1].blob


def test_document_without_content_is_skipped(tiny_flow):
    out = jina_client(tiny_flow).post('/', DocumentArray([Document(), Document(text=''), Document(text='x')]))
    assert out[0].embedding is None and out[1].embedding is None and out[2].embedding is not None


def test_profile_works(tiny_flow):
    result = clip_client(tiny_flow, 'grpc').profile()
    assert 'Roundtrip' in result


def test_large_request_order_kept(tiny_flow):
    texts = [f'caption number {i}' for i in range(50)]
    one_by_one = np.stack([clip_client(tiny_flow, 'grpc').encode([t])[0] for t in texts[:5]])
    together = clip_client(tiny_flow, 'grpc').encode(texts, batch_size=50)
    assert_close(together[:5], one_by_one, rel=1e-5)


def test_model_name_of_another_model_is_an_error(tiny_flow):
    from jina.excepts import BadServer

    with pytest.raises(BadServer, match='served models: clipserve-tiny::random'):
        jina_client(tiny_flow).post('/encode/ViT-L-14::openai', DocumentArray([Document(text='x')]))
    with pytest.raises(BadServer, match='not served'):
        clip_client(tiny_flow, 'grpc').encode(['x'], parameters={'model_name': 'RN50'})


def test_a_cpu_torch_replica_runs_without_triton(tiny_flow):
    if importlib.util.find_spec('triton') is None:
        pytest.skip('triton is not installed here, so there is nothing to keep out')
    responses = jina_client(tiny_flow).post('/clipserve/info', DocumentArray([Document()]), return_responses=True)
    info = next(iter(responses[0].parameters['__results__'].values()))
    assert info['torch_imported'] and info['device'] == 'cpu'
    assert info['triton_imported'] is False


def test_concurrent_single_document_requests_share_forward_passes(tiny_flow):
    def calls():
        responses = jina_client(tiny_flow).post('/clipserve/info', DocumentArray([Document()]), return_responses=True)
        return next(iter(responses[0].parameters['__results__'].values()))['model_calls']

    texts = [f'query number {i}' for i in range(48)]
    expected = clip_client(tiny_flow, 'grpc').encode(texts)
    before = calls()
    # one document per request, 24 streamed at once: many requests are in flight together (this Flow's gateway
    # is Jina's own, without the shipped gateways' stream cap: the client keeps within the replica's places)
    docs = DocumentArray([Document(id=str(i), text=t) for i, t in enumerate(texts)])
    out = jina_client(tiny_flow).post('/', docs, request_size=1, results_in_order=True, prefetch=24)
    assert [d.id for d in out] == [str(i) for i in range(48)]
    assert_close(out.embeddings, expected, rel=1e-5)  # each request got its own rows
    assert calls() - before < len(texts)  # fewer forward passes than requests: they were merged
