"""A late-interaction model (a tiny ColQwen2, built by the tests) served by the shipped flows/multi-protocol.yml:
over gRPC and HTTP, the Jina-protocol client (clipserve_client.jina) gets each document's [tokens, dim] vectors
equal to transformers' own model and processor, and /rank's maxsim_score and order equal MaxSim computed in
NumPy on them (and transformers' score_retrieval's order); the unchanged clip-client gets an error naming the
parameter that opts in, never a wrong shape."""

import base64
import importlib.util
import io
import sys

import numpy as np
import pytest
from docarray import Document, DocumentArray
from PIL import Image

from ..compare import relative_error
from ..late_interaction_folders import EMBEDDING_DIM, late_interaction_checkpoint, reference
from .conftest import ROOT, flow_from_yaml, free_port, make_image, set_port

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')
if importlib.util.find_spec('clipserve_client') is None:  # a checkout installed without the client
    sys.path.insert(0, str(ROOT / 'client'))

PROTOCOLS = ('grpc', 'http')
QUERIES = ['What was the revenue in 2020?', 'a cat', 'Café crème — à la carte']
PAGES = [make_image(60, 80, seed=1), make_image(90, 30, seed=2, fmt='JPEG'), make_image(32, 32, seed=3)]


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('late-flow')
    folder = late_interaction_checkpoint(tmp / 'colqwen2', 'colqwen2')
    ports = [free_port() for _ in ('grpc', 'http', 'websocket')]
    flow = flow_from_yaml(
        'multi-protocol.yml',
        tmp,
        lambda c: set_port(c, ports),
        {'CLIPSERVE_MODEL': f'transformers:{folder}', 'CLIPSERVE_DTYPE': 'fp32'},
    )
    with flow:
        yield folder, dict(zip(('grpc', 'http'), ports))


@pytest.fixture(scope='module')
def expected(served):
    """transformers' own vectors for QUERIES and PAGES (each alone, through its processor)."""
    processor, model = reference(served[0], 'colqwen2')
    with torch.no_grad():
        queries = [model(**processor.process_queries([q])).embeddings[0] for q in QUERIES]
        pages = [model(**processor.process_images([Image.open(io.BytesIO(p))])).embeddings[0] for p in PAGES]
    return processor, queries, pages


def _client(protocol, port):
    from clipserve_client.jina import Client

    return Client(f'{protocol}://127.0.0.1:{port}')


def numpy_maxsim(query, page) -> float:
    sims = np.asarray(query, np.float64) @ np.asarray(page, np.float64).T
    return float(sims.max(axis=1).sum())


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_each_document_comes_back_with_its_own_vectors(served, expected, protocol):
    _, queries, pages = expected
    client = _client(protocol, served[1][protocol])
    got = client.encode([*QUERIES, *PAGES], batch_size=3, parameters={'multi_vector': True})
    assert isinstance(got, list) and len(got) == len(QUERIES) + len(PAGES)
    for row, want in zip(got, [*queries, *pages]):
        assert row.shape == tuple(want.shape) and row.shape[1] == EMBEDDING_DIM
        assert relative_error(row, want.numpy()) <= 1e-5
    docs = client.encode(DocumentArray([Document(blob=p) for p in PAGES]), parameters={'multi_vector': True})
    for doc, want in zip(docs, pages):
        assert doc.embedding.shape == tuple(want.shape) and relative_error(doc.embedding, want.numpy()) <= 1e-5


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_rank_scores_by_maxsim_as_numpy_and_score_retrieval_order_them(served, expected, protocol):
    processor, queries, pages = expected
    docs = DocumentArray(
        [Document(text=q, matches=[Document(id=f'page{i}', blob=p) for i, p in enumerate(PAGES)]) for q in QUERIES]
    )
    ranked = _client(protocol, served[1][protocol]).rank(docs)
    retrieval = torch.cat([processor.score_retrieval(queries, [page]) for page in pages], dim=1).numpy()
    for row, (query, doc) in enumerate(zip(queries, ranked)):
        want = {f'page{i}': numpy_maxsim(query.numpy(), page.numpy()) for i, page in enumerate(pages)}
        got = {m.id: m.scores['maxsim_score'].value for m in doc.matches}
        assert got == pytest.approx(want, rel=1e-5)
        assert [m.id for m in doc.matches] == [f'page{i}' for i in np.argsort(-retrieval[row], kind='stable')]


def test_clip_client_gets_a_clear_error_not_a_wrong_shape(served):
    from clip_client import Client

    client = Client(f'grpc://127.0.0.1:{served[1]["grpc"]}')
    with pytest.raises(Exception, match='multi_vector=true'):
        client.encode(['a query'])
    with pytest.raises(Exception, match='multi_vector=true'):
        client.encode(DocumentArray([Document(blob=PAGES[0])]))


def test_openai_rank_answers_maxsim_and_embeddings_refuse_with_the_reason(served, expected):
    """/v1/rank of a late-interaction model: relevance_score is maxsim_score, best first; /v1/embeddings gives
    each input's [tokens, dim] vectors (as lists, or base64 with their shape) only with return_multivector and
    refuses with a 400 naming it otherwise; /v1/models says the model is multi-vector."""
    import requests

    _, queries, pages = expected
    base = f'http://127.0.0.1:{served[1]["http"]}'
    images = [{'image': 'data:image/png;base64,' + base64.b64encode(p).decode()} for p in PAGES]
    reply = requests.post(f'{base}/v1/rank', json={'query': QUERIES[0], 'documents': images}, timeout=120)
    assert reply.status_code == 200, reply.text
    results = reply.json()['results']
    want = [numpy_maxsim(queries[0].numpy(), page.numpy()) for page in pages]
    assert [r['index'] for r in results] == list(np.argsort(-np.asarray(want), kind='stable'))
    for r in results:
        assert r['relevance_score'] == r['maxsim_score'] == pytest.approx(want[r['index']], rel=1e-5)
        assert 'clip_score' not in r
    refused = requests.post(f'{base}/v1/embeddings', json={'input': ['a query']}, timeout=60)
    assert refused.status_code == 400 and refused.json()['error']['param'] == 'return_multivector', refused.text
    listed = requests.get(f'{base}/v1/models', timeout=60).json()['data']
    assert [m['multi_vector'] for m in listed] == [True]
    for encoding in ('float', 'base64'):
        body = {'input': [QUERIES[2], images[1]['image']], 'return_multivector': True, 'encoding_format': encoding}
        reply = requests.post(f'{base}/v1/embeddings', json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        for row, want in zip(reply.json()['data'], [queries[2], pages[1]]):
            got = row['embedding']
            if encoding == 'base64':
                got = np.frombuffer(base64.b64decode(got), '<f4').reshape(row['shape'])
            assert np.shape(got) == tuple(row['shape']) == tuple(want.shape)
            assert relative_error(np.asarray(got), want.numpy()) <= 1e-5
    again = requests.post(f'{base}/v1/rank', json={'query': QUERIES[1], 'documents': images[:1]}, timeout=120)
    assert again.status_code == 200, again.text
