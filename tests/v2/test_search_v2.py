"""CLIPIndexer in the DocArray v2 flavour: `ClipDoc`s into /index, `ClipQuery`s out of /search with `ClipMatch`
matches scored as the v1 indexer scores them (`scores['cosine']`: 1 - cosine similarity), filters, /status, and
two shards giving one shard's top k (the head's merge). The encoder serves the tiny model's ONNX export."""

import pytest
from docarray import DocList
from jina import Client, Flow

from clipserve import CLIPEncoder, CLIPIndexer
from clipserve.serving.schemas import ClipDoc, ClipQuery, ReadyReport

from .inputs import TEXTS

CAPTIONS = [f'{text} number {i}' for i in range(8) for text in TEXTS]
SHARD_POLLING = {'/index': 'ANY', '/search': 'ALL', '/status': 'ALL', '/clipserve/ready': 'ALL', '*': 'ANY'}


def documents() -> DocList[ClipDoc]:
    return DocList[ClipDoc](
        [ClipDoc(id=f'doc-{i}', text=c, tags={'n': i, 'even': i % 2 == 0}) for i, c in enumerate(CAPTIONS)]
    )


@pytest.fixture(scope='module', params=[1, 2], ids=['one shard', 'two shards'])
def served(request, export_dir, tmp_path_factory):
    from tests.integration.conftest import free_port

    port = free_port()
    indexer = {'index_path': str(tmp_path_factory.mktemp('index'))}
    if request.param > 1:
        indexer_args = {'shards': request.param, 'polling': SHARD_POLLING}
    else:
        indexer_args = {}
    flow = (
        Flow(port=port)
        .add(
            name='encoder',
            uses=CLIPEncoder,
            uses_with={'name': 'clipserve-tiny::random', 'backend': 'onnx', 'model_path': str(export_dir)},
        )
        .add(name='indexer', uses=CLIPIndexer, uses_with=indexer, **indexer_args)
    )
    with flow:
        client = Client(host='127.0.0.1', port=port)
        client.post('/index', documents(), request_size=7)
        yield client


def search(client, text, **parameters) -> list:
    [query] = client.post(
        '/search', DocList[ClipQuery]([ClipQuery(text=text)]), parameters=parameters, return_type=DocList[ClipQuery]
    )
    return list(query.matches)


def test_a_caption_finds_its_own_document_first_with_annlites_score(served):
    matches = search(served, CAPTIONS[9], limit=4)
    assert len(matches) == 4 and matches[0].id == 'doc-9' and matches[0].text == CAPTIONS[9]
    assert matches[0].tags['n'] == 9 and matches[0].scores['cosine'] == pytest.approx(0, abs=1e-5)
    distances = [m.scores['cosine'] for m in matches]
    assert distances == sorted(distances)


def test_filters_and_limit(served):
    matches = search(served, CAPTIONS[3], limit=6, filter={'even': True, 'n': {'$lt': 20}})
    assert len(matches) == 6 and all(m.tags['even'] and m.tags['n'] < 20 for m in matches)


def test_status_counts_every_document_across_shards(served):
    answer = served.post('/status', DocList[ClipDoc]([ClipDoc()]), return_type=DocList[ReadyReport])
    reports = [d.tags for d in answer if d.id.startswith('clipserve-index-status')]
    assert sum(r['count'] for r in reports) == len(CAPTIONS) and all(r['dim'] == 64 for r in reports)
