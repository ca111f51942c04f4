"""Cross-encoder reranking, served: flows/rerank.yml with a tiny random-weights XLM-RoBERTa reranker (built here)
on torch and onnx, called as the clients people use call it: `/v1/rerank` and `/rerank` in Cohere's and Jina's
shape, TEI's `/rerank`, `/v2/rerank` through the unchanged cohere SDK, and LangChain's CohereRerank pointed at
clipserve (both in an environment of their own: they need pydantic 2 and urllib3 2, which Jina excludes).
Scores equal transformers' on the same pairs; a pair scores the same alone and among 99 others."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from filelock import FileLock

from ..transformers_folders import cross_encoder_checkpoint
from .conftest import ROOT, FlowProcess, free_port

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

QUERY = 'what is the capital of france'
DOCUMENTS = [
    'paris is the capital and largest city of france',
    'the cat sat on the mat',
    'berlin is the capital of germany',
    'france is a country in europe; its capital is paris, a city on the seine with many museums and cafes ' * 3,
    'dogs',
]
CLIENTS_VENV = ROOT / '.venv-rerank-clients'
CLIENTS = ['cohere==5.21.1', 'langchain-cohere==0.6.0']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory) -> Path:
    return cross_encoder_checkpoint(tmp_path_factory.mktemp('reranker') / 'tiny-xlmr-reranker')


def transformers_scores(folder: Path, query: str, documents: list[str], max_length=None, side='right') -> np.ndarray:
    """transformers' own logits for the pairs, as its tokenizer pairs and truncates them."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.truncation_side = side
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    inputs = tokenizer(
        [query] * len(documents),
        documents,
        truncation=True,
        padding=True,
        max_length=max_length or 64,
        return_tensors='pt',
    )
    with torch.no_grad():
        return model(**inputs).logits[:, 0].numpy()


def sigmoid(x) -> np.ndarray:
    return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64)))


@pytest.fixture(scope='module', params=['torch', 'onnx'])
def served(request, checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f'rerank-{request.param}')
    config = yaml.safe_load((ROOT / 'flows' / 'rerank.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    env = {
        'CLIPSERVE_RERANK_MODEL': str(checkpoint),
        'CLIPSERVE_RERANK_BACKEND': request.param,
        'CLIPSERVE_RERANK_DTYPE': 'fp32',  # transformers' scores to 1e-5 (auto is bf16 where the CPU has it)
        'CLIPSERVE_CACHE': str(folder / 'cache'),  # the onnx backend exports the checkpoint into it on first use
    }
    with FlowProcess(config, folder, env):
        yield {'url': f'http://127.0.0.1:{ports[1]}', 'backend': request.param, 'model': str(checkpoint)}


def post(served, path, body) -> requests.Response:
    return requests.post(served['url'] + path, json=body, timeout=60)


@pytest.mark.parametrize('path', ['/v1/rerank', '/rerank'])
def test_cohere_and_jinas_shape_returns_transformers_scores_best_first(served, checkpoint, path):
    answer = post(served, path, {'query': QUERY, 'documents': DOCUMENTS, 'return_documents': True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    want = sigmoid(transformers_scores(checkpoint, QUERY, DOCUMENTS))
    got = {r['index']: r['relevance_score'] for r in body['results']}
    assert [got[i] for i in range(len(DOCUMENTS))] == pytest.approx(want, abs=1e-5)
    scores = [r['relevance_score'] for r in body['results']]
    assert scores == sorted(scores, reverse=True)
    assert all(r['document'] == {'text': DOCUMENTS[r['index']]} for r in body['results'])
    assert body['model'] == served['model'] and body['usage']['total_tokens'] > 0


def test_a_pair_scores_the_same_alone_and_among_99_others(served):
    others = [f'another document about topic number {i}, ' + 'with words ' * (i % 9) for i in range(99)]
    alone = post(served, '/v1/rerank', {'query': QUERY, 'documents': [DOCUMENTS[0]]}).json()['results'][0]
    many = post(served, '/v1/rerank', {'query': QUERY, 'documents': [*others[:50], DOCUMENTS[0], *others[50:]]}).json()
    among = next(r for r in many['results'] if r['index'] == 50)
    assert len(many['results']) == 100 and among['relevance_score'] == pytest.approx(alone['relevance_score'], abs=1e-5)


def test_top_n_and_items_in_jinas_shape(served):
    body = post(
        served, '/v1/rerank', {'query': QUERY, 'documents': [{'text': d} for d in DOCUMENTS], 'top_n': 2}
    ).json()
    assert len(body['results']) == 2 and 'document' not in body['results'][0]


def test_teis_rerank_body_gets_teis_answer(served, checkpoint):
    raw = post(served, '/rerank', {'query': QUERY, 'texts': DOCUMENTS, 'raw_scores': True, 'return_text': True}).json()
    assert isinstance(raw, list) and {r['text'] for r in raw} == set(DOCUMENTS)
    want = transformers_scores(checkpoint, QUERY, DOCUMENTS)
    assert [next(r['score'] for r in raw if r['index'] == i) for i in range(len(DOCUMENTS))] == pytest.approx(
        want, abs=1e-5
    )
    plain = post(served, '/rerank', {'query': QUERY, 'texts': DOCUMENTS}).json()
    assert (
        sorted(r['score'] for r in plain) == pytest.approx(sorted(sigmoid(want)), abs=1e-5) and 'text' not in plain[0]
    )


@pytest.mark.parametrize('side', ['right', 'left'])
def test_max_length_and_truncation_direction_are_transformers_own(served, checkpoint, side):
    body = {'query': QUERY, 'documents': DOCUMENTS, 'max_length': 12, 'truncation_direction': side}
    got = {r['index']: r['relevance_score'] for r in post(served, '/v1/rerank', body).json()['results']}
    want = sigmoid(transformers_scores(checkpoint, QUERY, DOCUMENTS, max_length=12, side=side))
    assert [got[i] for i in range(len(DOCUMENTS))] == pytest.approx(want, abs=1e-5)


def test_truncate_false_names_the_document_that_is_too_long(served):
    answer = post(served, '/v1/rerank', {'query': QUERY, 'documents': DOCUMENTS, 'truncate': False, 'max_length': 16})
    assert answer.status_code == 400
    error = answer.json()['error']
    assert error['param'] == 'documents[0]' and 'longer than 16 tokens' in error['message']


@pytest.mark.parametrize(
    'body, param, words',
    [
        ({'documents': ['a']}, 'query', "'query' is required"),
        ({'query': 'q', 'documents': []}, 'documents', 'non-empty list'),
        ({'query': 'q', 'documents': [{'image': 'data:image/png;base64,AAAA'}]}, 'documents[0]', 'text cross-encoders'),
        ({'query': 'q', 'documents': ['a'], 'top_n': 0}, 'top_n', 'integer >= 1'),
        ({'query': 'q', 'documents': ['a'], 'truncation_direction': 'up'}, 'truncation_direction', 'right or left'),
        ({'query': 'q', 'documents': ['a'], 'model': 'rerank-v9'}, None, None),  # one reranker: any name reaches it
    ],
)
def test_bad_bodies_are_400s_naming_the_field(served, body, param, words):
    answer = post(served, '/v1/rerank', body)
    if words is None:
        assert answer.status_code == 200, answer.text
        return
    assert answer.status_code == 400, answer.text
    assert answer.json()['error']['param'] == param and words in answer.json()['error']['message']


# ---- the clients people use: cohere's SDK and LangChain, unchanged ------------------------------------


def clients_environment() -> Path:
    """An environment with the cohere SDK and langchain-cohere (pydantic 2, urllib3 2), made once per recipe."""
    python = CLIENTS_VENV / 'bin' / 'python'
    marker = CLIENTS_VENV / f'.clipserve-{hashlib.sha256(" ".join(CLIENTS).encode()).hexdigest()[:12]}'
    with FileLock(str(CLIENTS_VENV) + '.lock'):
        if not marker.is_file():
            started = time.monotonic()
            subprocess.run(['rm', '-rf', str(CLIENTS_VENV)], check=True)
            subprocess.run([sys.executable, '-m', 'venv', str(CLIENTS_VENV)], check=True, capture_output=True)
            pip = [str(python), '-m', 'pip', 'install', '-q', '--disable-pip-version-check', *CLIENTS]
            done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f'cannot build {CLIENTS_VENV}:\n{done.stderr[-3000:]}'
            marker.write_text(f'built in {time.monotonic() - started:.0f}s\n')
    return python


CLIENT_SCRIPT = """
import json, sys
import cohere
from langchain_cohere import CohereRerank
from langchain_core.documents import Document

base_url, model, query, documents = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
client = cohere.ClientV2(api_key='unused', base_url=base_url)
answer = client.rerank(model=model, query=query, documents=documents, top_n=3)
out = {'sdk': [[r.index, r.relevance_score] for r in answer.results]}
compressor = CohereRerank(base_url=base_url, cohere_api_key='unused', model=model, top_n=2)
kept = compressor.compress_documents([Document(page_content=d) for d in documents], query)
out['langchain'] = [[d.page_content, d.metadata['relevance_score']] for d in kept]
print(json.dumps(out))
"""


def test_the_cohere_sdk_and_langchains_cohere_reranker_get_the_scores(served, checkpoint):
    if served['backend'] != 'torch':
        pytest.skip('the clients run once, against the torch reranker')
    python = clients_environment()
    ran = subprocess.run(
        [str(python), '-c', CLIENT_SCRIPT, served['url'], 'tiny-xlmr-reranker', QUERY, json.dumps(DOCUMENTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    want = sigmoid(transformers_scores(checkpoint, QUERY, DOCUMENTS))
    best = np.argsort(-want)
    assert [i for i, _ in out['sdk']] == list(best[:3])
    assert [s for _, s in out['sdk']] == pytest.approx(list(want[best[:3]]), abs=1e-5)
    assert [text for text, _ in out['langchain']] == [DOCUMENTS[i] for i in best[:2]]


# ---- retrieve, then rerank, in one call ----------------------------------------------------------------


def test_v1_search_reranks_its_candidates_captions_in_one_call(checkpoint, tmp_path):
    """flows/search-rerank.yml: /v1/search retrieves top_k by CLIP, then the reranker orders their captions
    (transformers' scores) and keeps top_n; a search without `rerank` keeps the CLIP order."""
    from clip_client import Client

    from .conftest import TINY

    config = yaml.safe_load((ROOT / 'flows' / 'search-rerank.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    env = {
        'CLIPSERVE_MODEL': TINY,
        'CLIPSERVE_RERANK_MODEL': str(checkpoint),
        'CLIPSERVE_INDEX_PATH': str(tmp_path / 'index'),
    }
    captions = [f'{d} (caption {i})' for i, d in enumerate(DOCUMENTS * 4)]
    with FlowProcess(config, tmp_path / 'flow', env):
        from docarray import Document

        Client(f'grpc://127.0.0.1:{ports[0]}').index([Document(text=c, tags={'i': i}) for i, c in enumerate(captions)])
        url = f'http://127.0.0.1:{ports[1]}/v1/search'
        plain = requests.post(url, json={'query': QUERY, 'top_k': 12}, timeout=60).json()['results']
        assert 'rerank_score' not in plain[0]
        body = {'query': QUERY, 'top_k': 12, 'rerank': {'top_n': 5}}
        answer = requests.post(url, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        reranked = answer.json()['results']
        texts = [r['text'] for r in plain]
        want = dict(zip(texts, sigmoid(transformers_scores(checkpoint, QUERY, texts))))
        assert [r['text'] for r in reranked] == sorted(texts, key=lambda t: -want[t])[:5]
        assert [r['rerank_score'] for r in reranked] == pytest.approx([want[r['text']] for r in reranked], abs=1e-5)
        refused = requests.post(url, json={'vector': [0.1] * 64, 'rerank': True}, timeout=60)
        assert refused.status_code == 400 and refused.json()['error']['param'] == 'rerank'


def test_the_light_client_reranks(served, checkpoint):
    from clipserve_client import Client

    with Client(served['url']) as client:
        results = client.rerank(QUERY, DOCUMENTS, top_n=3)
    want = sigmoid(transformers_scores(checkpoint, QUERY, DOCUMENTS))
    assert [r.index for r in results] == list(np.argsort(-want)[:3])
    assert [r.relevance_score for r in results] == pytest.approx(list(np.sort(want)[::-1][:3]), abs=1e-5)
