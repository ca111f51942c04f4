"""Search with the unchanged clip-client 0.8.3: flows/search.yml (encoder + CLIPIndexer on the embedded Qdrant
engine) and flows/search-shards.yml (the index in 2 shards, merged exactly), served by `jina flow --uses`.

The model has random weights (no downloads here), so a caption and its image do not embed close to each
other; the captioned images are indexed as clip-as-service's clients index them, one document with the image
(a data URI) and its caption, where the caption is what is embedded (a document's text wins over its image),
so searching a caption finds its own image first. Image-to-image search uses images alone.
"""

import asyncio

import numpy as np
import pytest
import requests
import yaml
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from .conftest import ROOT, TINY, FlowProcess, data_uri, free_port, make_image

CAPTIONED = 1000
IMAGES_ONLY = 60


def search_flow(name: str, folder, index_path) -> FlowProcess:
    config = yaml.safe_load((ROOT / 'flows' / name).read_text())
    config['gateway']['port'] = [free_port() for _ in range(3)]
    return FlowProcess(config, folder, {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_INDEX_PATH': str(index_path)})


def captioned(i: int) -> Document:
    tags = {'n': i, 'parity': ['even', 'odd'][i % 2], 'group': f'g{i % 5}'}
    return Document(uri=data_uri(make_image(32, 24, seed=i)), text=f'a photo of thing number {i}', tags=tags)


def image_only(i: int) -> Document:
    return Document(blob=make_image(40, 30, seed=10_000 + i), tags={'image': i})


@pytest.fixture(scope='module')
def single(tmp_path_factory):
    folder = tmp_path_factory.mktemp('search')
    with search_flow('search.yml', folder, folder / 'index') as flow:
        client = Client(f'grpc://127.0.0.1:{flow.port}')
        client.index([captioned(i) for i in range(CAPTIONED)], batch_size=64)
        client.index([image_only(i) for i in range(IMAGES_ONLY)], batch_size=16)
        yield {'flow': flow, 'client': client, 'folder': folder}


@pytest.fixture(scope='module')
def sharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp('search-shards')
    with search_flow('search-shards.yml', folder, folder / 'index') as flow:
        client = Client(f'grpc://127.0.0.1:{flow.port}')
        client.index([captioned(i) for i in range(CAPTIONED)], batch_size=64)
        yield {'flow': flow, 'client': client}


def status(port: int) -> list[dict]:
    answer = JinaClient(host='127.0.0.1', port=port).post('/status', DocumentArray([Document()]))
    return sorted(
        (dict(d.tags) for d in answer if d.id.startswith('clipserve-index-status')), key=lambda t: t['shard_id']
    )


QUERIES = [0, 1, 7, 123, 500, 999]


def test_clip_clients_search_finds_each_captions_own_image_first(single):
    found = single['client'].search([f'a photo of thing number {i}' for i in QUERIES], limit=5)
    for i, query in zip(QUERIES, found):
        matches = query.matches
        assert len(matches) == 5
        assert matches[0].text == f'a photo of thing number {i}' and matches[0].tags['n'] == i
        assert matches[0].uri == captioned(i).uri  # the image comes back with its caption
        distances = [m.scores['cosine'].value or 0.0 for m in matches]  # an exact match's 0 arrives as None
        assert distances == sorted(distances) and distances[0] == pytest.approx(0, abs=1e-5)


def test_image_to_image_search_finds_the_image_first(single):
    queries = [Document(blob=image_only(i).blob) for i in (0, 17, 59)]
    found = single['client'].search(queries, limit=3)
    assert [q.matches[0].tags['image'] for q in found] == [0, 17, 59]


def test_limit_and_an_annlite_filter_are_honoured(single):
    client = single['client']
    found = client.search(['a photo of thing number 7'], limit=20, parameters={'filter': {'parity': {'$eq': 'even'}}})
    matches = found[0].matches
    assert len(matches) == 20 and all(m.tags['parity'] == 'even' for m in matches)
    where = {'$and': [{'group': {'$in': ['g1', 'g3']}}, {'n': {'$gte': 100, '$lt': 200}}]}
    matches = client.search(['a photo of thing number 7'], limit=50, parameters={'filter': where})[0].matches
    assert len(matches) == 40 and all(m.tags['group'] in ('g1', 'g3') and 100 <= m.tags['n'] < 200 for m in matches)


def test_the_async_forms_work_unchanged(single):
    client = single['client']

    async def index_then_search():
        await client.aindex([Document(text='an async caption', tags={'async': True})])
        return await client.asearch(['an async caption'], limit=1)

    found = asyncio.run(index_then_search())
    assert found[0].matches[0].text == 'an async caption'


def test_two_shards_give_the_same_top_k_as_one(single, sharded):
    shards = status(sharded['flow'].port)
    assert len(shards) == 2 and sum(s['count'] for s in shards) == CAPTIONED and all(s['count'] > 0 for s in shards)
    texts = [f'a photo of thing number {i}' for i in QUERIES]
    for limit, where in ((10, None), (3, None), (25, {'parity': 'odd'})):
        parameters = {'filter': where} if where else {}
        one = single['client'].search(texts, limit=limit, parameters=parameters)
        two = sharded['client'].search(texts, limit=limit, parameters=parameters)
        for a, b in zip(one, two):
            assert [m.tags['n'] for m in a.matches] == [m.tags['n'] for m in b.matches]
            assert [m.scores['cosine'].value or 0 for m in a.matches] == pytest.approx(
                [m.scores['cosine'].value or 0 for m in b.matches], abs=1e-6
            )


def test_status_update_delete_and_clear(tmp_path):
    with search_flow('search.yml', tmp_path / 'flow', tmp_path / 'index') as flow:
        jina = JinaClient(host='127.0.0.1', port=flow.port)
        client = Client(f'grpc://127.0.0.1:{flow.port}')
        client.index([Document(id=f'd{i}', text=f'caption {i}', tags={'v': 1}) for i in range(10)])
        (shard,) = status(flow.port)
        assert shard['count'] == 10 and shard['dim'] == 64 and shard['metric'] == 'cosine'
        assert shard['engine'] == 'qdrant-edge' and shard['path'] == str(tmp_path / 'index')
        # /update: an existing document changes; one that is not there is not added (or, asked, named)
        jina.post('/update', DocumentArray([Document(id='d3', text='caption 3 changed', tags={'v': 2})]))
        match = client.search(['caption 3 changed'], limit=1)[0].matches[0]
        assert (match.id, match.text, match.tags['v']) == ('d3', 'caption 3 changed', 2)
        with pytest.raises(Exception, match=r'could not be updated: document .*ghost.*: is not in the index'):
            jina.post(
                '/update',
                DocumentArray([Document(id='ghost', text='x')]),
                parameters={'raise_errors_on_not_found': True},
            )
        jina.post('/update', DocumentArray([Document(id='ghost', text='x')]))
        assert status(flow.port)[0]['count'] == 10
        # /delete: by the documents' ids and by parameters.ids
        jina.post('/delete', DocumentArray([Document(id='d0')]), parameters={'ids': ['d1', 'd2']})
        assert status(flow.port)[0]['count'] == 7
        assert {m.id for m in client.search(['caption 1'], limit=10)[0].matches} == {f'd{i}' for i in range(3, 10)}
        jina.post('/clear', DocumentArray([Document()]))
        assert status(flow.port)[0]['count'] == 0 and len(client.search(['caption 1'])[0].matches) == 0
        # the encoder's own endpoints pass the indexer untouched
        assert client.encode(['still encodes']).shape == (1, 64)


def test_bad_search_parameters_are_clear_errors_and_the_flow_keeps_serving(single):
    jina = JinaClient(host='127.0.0.1', port=single['flow'].port)
    query = DocumentArray([Document(text='a photo of thing number 1')])
    for parameters, words in (
        ({'filter': {'n': {'$like': 3}}}, r'filter.n: unknown operator .*like'),
        ({'limit': 0}, r'limit.* must be an integer >= 1'),
        ({'filter': 'n > 3'}, 'filter must be an object'),
    ):
        with pytest.raises(Exception, match=words):
            jina.post('/search', query, parameters=parameters)
    assert len(single['client'].search(['a photo of thing number 1'], limit=2)[0].matches) == 2


def test_every_acknowledged_document_survives_kill_9_and_a_restart(tmp_path):
    flow = search_flow('search.yml', tmp_path / 'flow', tmp_path / 'index').wait_ready()
    try:
        client = Client(f'grpc://127.0.0.1:{flow.port}')
        client.index([Document(id=f'kept-{i}', text=f'kept caption {i}') for i in range(300)], batch_size=25)
    finally:
        flow.kill()  # no shutdown, no flush: only what the write-ahead log holds
    with search_flow('search.yml', tmp_path / 'flow-again', tmp_path / 'index') as again:
        assert status(again.port)[0]['count'] == 300
        found = Client(f'grpc://127.0.0.1:{again.port}').search([f'kept caption {i}' for i in (0, 150, 299)], limit=1)
        assert [q.matches[0].id for q in found] == ['kept-0', 'kept-150', 'kept-299']


def test_an_unwritable_index_path_fails_at_start_naming_it(tmp_path):
    blocker = tmp_path / 'a-file'
    blocker.write_text('not a folder')
    flow = search_flow('search.yml', tmp_path / 'flow', blocker / 'index')
    flow.process.wait(240)
    log = flow.log()
    assert flow.process.returncode != 0
    assert 'cannot be written' in log and str(blocker / 'index') in log


def test_documents_without_embeddings_are_named(single):
    """An indexer alone in a Flow (no encoder before it) refuses documents that carry no embedding."""
    from jina import Flow

    from clipserve import CLIPIndexer

    with Flow(port=free_port()).add(uses=CLIPIndexer, uses_with={'index_path': str(single['folder'] / 'bare')}) as f:
        with pytest.raises(Exception, match=r'could not be indexed: document .*bare-1.*: has no embedding to index'):
            f.post('/index', DocumentArray([Document(id='bare-1', text='x')]))
        f.post('/index', DocumentArray([Document(id='v', embedding=np.ones(4, np.float32))]))
        assert f.post('/search', DocumentArray([Document(embedding=np.ones(4, np.float32))]))[0].matches[0].id == 'v'


# ---- /v1/search on the HTTP port ----------------------------------------------------------------------


def v1_search(flow, body):
    http = flow.config['gateway']['port'][1]
    return requests.post(f'http://127.0.0.1:{http}/v1/search', json=body, timeout=60)


def test_v1_search_answers_ids_scores_and_payload_for_a_text_an_image_or_a_vector(single):
    flow = single['flow']
    answer = v1_search(flow, {'query': 'a photo of thing number 123', 'top_k': 4})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body['object'] == 'list' and body['metric'] == 'cosine' and body['usage']['prompt_tokens'] > 0
    first = body['results'][0]
    assert (
        first['text'] == 'a photo of thing number 123'
        and first['tags']['n'] == 123
        and first['uri'].startswith('data:')
    )
    assert first['score'] == pytest.approx(1, abs=1e-5) and len(body['results']) == 4
    scores = [r['score'] for r in body['results']]
    assert scores == sorted(scores, reverse=True)
    image = data_uri(image_only(17).blob)
    by_image = v1_search(flow, {'query': {'image': image}, 'top_k': 1, 'return_payload': ['tags']}).json()
    assert by_image['results'][0] == {
        'id': by_image['results'][0]['id'],
        'score': by_image['results'][0]['score'],
        'tags': {'image': 17},
    }
    vector = Client(f'grpc://127.0.0.1:{flow.port}').encode(['a photo of thing number 5'])[0]
    by_vector = v1_search(flow, {'vector': vector.tolist(), 'top_k': 2, 'return_payload': False}).json()
    assert set(by_vector['results'][0]) == {'id', 'score'} and by_vector['usage']['prompt_tokens'] == 0
    where = {'filter': {'parity': 'odd', 'n': {'$lt': 100}}, 'top_k': 30}
    filtered = v1_search(flow, {'query': 'a photo of thing number 40', **where}).json()['results']
    assert len(filtered) == 30 and all(r['tags']['parity'] == 'odd' and r['tags']['n'] < 100 for r in filtered)
    qdrant = {'must': [{'key': 'tags.group', 'match': {'value': 'g2'}}]}
    native = v1_search(flow, {'query': 'a photo of thing number 40', 'filter': qdrant, 'top_k': 5}).json()['results']
    assert all(r['tags']['group'] == 'g2' for r in native)


@pytest.mark.parametrize(
    'body, param, words',
    [
        ({}, 'query', 'exactly one of'),
        ({'query': 'a', 'vector': [1.0]}, 'query', 'exactly one of'),
        ({'query': 'a', 'top_k': 0}, 'top_k', 'from 1 to 1000'),
        ({'query': 'a', 'filter': {'n': {'$between': [1, 2]}}}, 'filter', 'unknown operator'),
        ({'query': 'a', 'return_payload': ['embedding']}, 'return_payload', 'true, false or a list'),
        ({'vector': [1.0, 'x']}, 'vector', 'finite numbers'),
        ({'vector': [0.5, 0.5, 0.5]}, None, 'the query is a 3-dimensional embedding, the index holds 64'),
    ],
)
def test_v1_search_bad_requests_are_400s_naming_the_field(single, body, param, words):
    answer = v1_search(single['flow'], body)
    assert answer.status_code == 400, answer.text
    error = answer.json()['error']
    assert error['param'] == param and words in error['message']


# ---- pages of vectors: a late-interaction model's index ----------------------------------------------


def test_colqwen2_pages_are_indexed_as_multi_vectors_and_searched_in_the_exact_maxsim_order(tmp_path):
    """A tiny ColQwen2 (built here) behind flows/search.yml: pages indexed with `multi_vector: true` become
    multi-vector points, and /search's order and scores equal MaxSim computed in NumPy on the same vectors."""
    pytest.importorskip('transformers')
    from clipserve.engine.ranking import maxsim

    from ..late_interaction_folders import late_interaction_checkpoint

    folder = late_interaction_checkpoint(tmp_path / 'colqwen2', 'colqwen2')
    config = yaml.safe_load((ROOT / 'flows' / 'search.yml').read_text())
    config['gateway']['port'] = [free_port() for _ in range(3)]
    env = {
        'CLIPSERVE_MODEL': f'transformers:{folder}',
        'CLIPSERVE_DTYPE': 'fp32',
        'CLIPSERVE_INDEX_PATH': str(tmp_path / 'index'),
    }
    pages = [make_image(60 + 7 * i, 40 + 5 * i, seed=i) for i in range(12)]
    queries = ['revenue in 2020', 'a cat', 'the blue page']
    multi = {'multi_vector': True}
    with FlowProcess(config, tmp_path / 'flow', env) as flow:
        jina = JinaClient(host='127.0.0.1', port=flow.port)
        page_docs = DocumentArray([Document(id=f'page-{i}', blob=p) for i, p in enumerate(pages)])
        indexed = jina.post('/index', page_docs, parameters=multi, results_in_order=True)
        vectors = [np.asarray(d.embedding, np.float32) for d in indexed]
        assert all(v.ndim == 2 for v in vectors)
        (shard,) = status(flow.port)
        assert shard['multi_vector'] is True and shard['metric'] == 'inner_product'
        found = jina.post(
            '/search',
            DocumentArray([Document(text=q) for q in queries]),
            parameters={**multi, 'limit': 5},
            results_in_order=True,
        )
        query_vectors = [np.asarray(d.embedding, np.float32) for d in found]
        exact = maxsim(query_vectors, vectors)
        for q, answer in enumerate(found):
            want = [f'page-{i}' for i in np.argsort(-exact[q], kind='stable')[:5]]
            assert [m.id for m in answer.matches] == want
            assert [m.scores['maxsim'].value for m in answer.matches] == pytest.approx(
                sorted(exact[q], reverse=True)[:5], rel=1e-4
            )


def test_the_light_client_searches_with_a_text_an_image_or_a_vector(single):
    from clipserve_client import Client

    http = single['flow'].config['gateway']['port'][1]
    with Client(f'http://127.0.0.1:{http}') as client:
        by_text = client.search('a photo of thing number 42', top_k=3, filter={'parity': 'even'})
        assert by_text[0].text == 'a photo of thing number 42' and all(f.tags['parity'] == 'even' for f in by_text)
        by_image = client.search(image_only(5).blob, top_k=1)
        assert by_image[0].tags == {'image': 5}
        vector = client.encode(['a photo of thing number 9'])[0]
        assert client.search(vector=vector, top_k=1)[0].text == 'a photo of thing number 9'
