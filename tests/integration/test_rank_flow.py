"""/rank as legacy clients read it: clip-client 0.8.3 against the shipped Flow YAMLs, and CLIPRanker in-process."""

import base64
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient
from jina.excepts import BadServer

from .conftest import TINY, data_uri, flow_from_yaml, free_port, make_image, set_port


@pytest.fixture(scope='module', params=['torch.yml', 'rank.yml'])
def rank_server(request, tmp_path_factory):
    port = free_port()
    flow = flow_from_yaml(
        request.param, tmp_path_factory.mktemp('flows'), lambda c: set_port(c, port), {'CLIPSERVE_MODEL': TINY}
    )
    with flow:
        yield f'grpc://127.0.0.1:{port}'


def _texts(*texts):
    return [Document(text=t) for t in texts]


def _images(*seeds):
    return [Document(blob=make_image(seed=s)) for s in seeds]


CASES = {
    'text->images': lambda: Document(text='a photo of a dog', matches=_images(1, 2, 3, 4)),
    'image->texts': lambda: Document(blob=make_image(seed=9), matches=_texts('a dog', 'a cat', 'a car', 'the moon')),
    'text->texts': lambda: Document(text='query', matches=_texts('one', 'two', 'three')),
    'image->images': lambda: Document(uri=data_uri(make_image(seed=5)), matches=_images(5, 6, 7)),
}


@pytest.fixture(scope='module')
def reference_encoder():
    """The same model in-process, for embeddings to recompute scores from (rank.yml serves no /encode)."""
    from clipserve import CLIPEncoder

    encoder = CLIPEncoder(name=TINY)
    yield encoder
    encoder.close()


@pytest.mark.parametrize('case', list(CASES))
def test_rank_contract(rank_server, reference_encoder, case):
    client = Client(rank_server)
    query = CASES[case]()
    reference = DocumentArray([Document(query, copy=True)])
    out = client.rank(DocumentArray([query]))
    matches = out[0].matches
    scores = np.array([m.scores['clip_score'].value for m in matches])
    cosines = np.array([m.scores['clip_score_cosine'].value for m in matches])
    assert abs(scores.sum() - 1) < 1e-6
    assert np.all((cosines >= -1) & (cosines <= 1))
    assert list(scores) == sorted(scores, reverse=True)
    assert all(m.scores['clip_score'].op_name == 'softmax' for m in matches)
    assert all(m.scores['clip_score_cosine'].op_name == 'cosine' for m in matches)
    assert all(m.embedding is None for m in matches)

    # clip_score must equal softmax(100 x cosine) recomputed from encode() of the same inputs
    encoded = reference_encoder.encode(DocumentArray([reference[0], *reference[0].matches]), {})
    q, c = encoded[0].embedding, np.stack([d.embedding for d in encoded[1:]])
    cos = c @ q / (np.linalg.norm(c, axis=1) * np.linalg.norm(q))
    expected = np.exp(100 * (cos - cos.max()))
    expected /= expected.sum()
    by_id = {d.id: (p, k) for d, p, k in zip(reference[0].matches, expected, cos)}
    for m in matches:
        p, k = by_id[m.id]
        assert abs(m.scores['clip_score'].value - p) < 1e-5
        assert abs(m.scores['clip_score_cosine'].value - k) < 1e-5


def test_rank_many_queries_keep_order_and_identity(rank_server):
    docs = DocumentArray([Document(id=str(i), text=f'query {i}', matches=_texts('a', 'b', f'c{i}')) for i in range(12)])
    originals = list(docs)
    out = Client(rank_server).rank(docs, batch_size=1)
    assert [d.id for d in out] == [str(i) for i in range(12)]
    assert all(a is b for a, b in zip(out, originals))
    assert all(len(d.matches) == 3 for d in out)


def test_rank_with_model_name_endpoint(rank_server):
    out = Client(rank_server).rank(DocumentArray([CASES['text->texts']()]), parameters={'model_name': TINY})
    assert abs(sum(m.scores['clip_score'].value for m in out[0].matches) - 1) < 1e-6


def _post(server, docs, parameters=None):
    host, port = server.replace('grpc://', '').split(':')
    return JinaClient(host=host, port=int(port)).post('/rank', docs, parameters=parameters or {})


def test_query_without_matches_is_an_error_naming_it(rank_server):
    with pytest.raises(BadServer, match='lonely'):
        _post(rank_server, DocumentArray([Document(id='lonely', text='q')]))
    out = _post(
        rank_server,
        DocumentArray([Document(id='lonely', text='q'), CASES['text->texts']()]),
        {'allow_empty_matches': True},
    )
    assert len(out[0].matches) == 0
    assert len(out[1].matches) == 3


def test_match_without_content_is_an_error_naming_it(rank_server):
    query = Document(text='q', matches=[Document(id='hollow'), Document(text='fine')])
    with pytest.raises(BadServer, match='hollow'):
        _post(rank_server, DocumentArray([query]))


def test_drop_image_content_is_honoured_on_rank(rank_server):
    query = Document(blob=make_image(seed=1), matches=_images(2, 3))
    out = _post(rank_server, DocumentArray([query]), {'drop_image_content': True})
    assert not out[0].blob and all(not m.blob for m in out[0].matches)
    assert out[0].embedding is not None
    kept = _post(rank_server, DocumentArray([Document(blob=make_image(seed=1), matches=_images(2, 3))]))
    assert kept[0].blob and all(m.blob for m in kept[0].matches)


def test_http_json_as_documented(tmp_path_factory):
    """clip-as-service's documented raw JSON (POST /post) against the HTTP gateway of flows/multi-protocol.yml."""
    ports = [free_port() for _ in range(3)]
    flow = flow_from_yaml(
        'multi-protocol.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports), {'CLIPSERVE_MODEL': TINY}
    )
    with flow:
        url = f'http://127.0.0.1:{ports[1]}/post'
        png = make_image(seed=3)
        body = {
            'execEndpoint': '/rank',
            'data': [{'uri': data_uri(png), 'matches': [{'text': 'a woman'}, {'text': 'a man'}]}],
        }
        reply = requests.post(url, json=body, timeout=60).json()
        matches = reply['data'][0]['matches']
        scores = [m['scores']['clip_score']['value'] for m in matches]
        assert abs(sum(scores) - 1) < 1e-6 and scores == sorted(scores, reverse=True)
        assert all(m['scores']['clip_score_cosine']['op_name'] == 'cosine' for m in matches)

        body = {'execEndpoint': '/', 'data': [{'text': 'hello'}, {'blob': base64.b64encode(png).decode()}]}
        data = requests.post(url, json=body, timeout=60).json()['data']
        assert all(len(d['embedding']) == 64 for d in data)

        # the health checks the README documents
        assert requests.get(f'http://127.0.0.1:{ports[1]}/status', timeout=30).status_code == 200
        jina = str(Path(sys.executable).parent / 'jina')
        ping = subprocess.run([jina, 'ping', 'flow', f'grpc://127.0.0.1:{ports[0]}'], capture_output=True, timeout=120)
        assert ping.returncode == 0, ping.stdout[-2000:]
