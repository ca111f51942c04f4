"""CLIPEncoder and CLIPRanker called in-process (no sockets), for what a Flow cannot observe: model calls."""

import logging

import numpy as np
import pytest
from docarray import Document, DocumentArray

from clipserve import CLIPEncoder, CLIPRanker
from clipserve.errors import InvalidDocumentError, InvalidParameterError

from ..conftest import TINY


@pytest.fixture(scope='module')
def ranker():
    executor = CLIPRanker(name=TINY, minibatch_size=8)
    yield executor
    executor.close()


@pytest.fixture(scope='module')
def encoder():
    executor = CLIPEncoder(name=TINY, minibatch_size=8)
    yield executor
    executor.close()


def test_reranking_pre_embedded_matches_costs_one_model_call_per_query(ranker, encoder):
    stored = DocumentArray([Document(text=f'stored caption {i}') for i in range(100)])
    encoder.encode(stored, {})
    queries = DocumentArray([Document(text=f'query {q}', matches=DocumentArray(stored, copy=True)) for q in range(3)])
    before = ranker.backend.model_calls
    ranker.rank(queries, {})
    assert ranker.backend.model_calls - before == 1  # three queries fit one minibatch: one forward pass
    for query in queries:
        scores = [m.scores['clip_score'].value for m in query.matches]
        assert len(scores) == 100 and abs(sum(scores) - 1) < 1e-6

    single = DocumentArray([Document(text='one query', matches=DocumentArray(stored, copy=True))])
    before = ranker.backend.model_calls
    ranker.rank(single, {})
    assert ranker.backend.model_calls - before == 1


def test_ranker_reencodes_when_asked(ranker):
    matches = DocumentArray([Document(text=f'm{i}', embedding=np.ones(64, np.float32)) for i in range(4)])
    query = DocumentArray([Document(text='q', matches=matches)])
    before = ranker.backend.model_calls
    ranker.rank(query, {'reuse_embeddings': False})
    assert ranker.backend.model_calls - before == 1  # query and 4 matches in one text minibatch
    assert len({round(m.scores['clip_score_cosine'].value, 6) for m in query[0].matches}) > 1


def test_ranker_rejects_embeddings_of_the_wrong_dimension(ranker):
    query = DocumentArray([Document(text='q', matches=[Document(id='short', embedding=np.ones(3))])])
    with pytest.raises(InvalidDocumentError, match='short'):
        ranker.rank(query, {})


def test_encoder_rank_matches_ranker_rank(ranker, encoder):
    def make():
        return DocumentArray([Document(text='a dog', matches=[Document(text='dog'), Document(text='cat')])])

    a, b = make(), make()
    encoder.rank(a, {})
    ranker.rank(b, {})
    assert [m.text for m in a[0].matches] == [m.text for m in b[0].matches]
    for x, y in zip(a[0].matches, b[0].matches):
        assert abs(x.scores['clip_score'].value - y.scores['clip_score'].value) < 1e-6


def test_model_endpoint_aliases_are_bound(encoder, ranker):
    assert f'/rank/{TINY}' in encoder.requests
    assert f'/rank/{TINY}' in ranker.requests


def test_warm_up_runs_before_serving_and_leaves_the_counters_at_zero():
    executor = CLIPEncoder(name=TINY)
    try:
        assert executor.warmup_seconds > 0 and executor.backend.model_calls == 0
        info = executor.info()
        assert info['warmup_seconds'] > 0 and info['draining'] is False and info['texts_encoded'] == 0
    finally:
        executor.close()


def test_the_constructor_takes_clip_as_services_arguments_and_names_an_unknown_one():
    """clip-as-service's `with:` keys (jit and traversal_paths included) build an executor; a key no setting
    has is refused naming it, where Jina's Executor would have dropped it silently."""
    executor = CLIPEncoder(name=TINY, jit=False, traversal_paths='@r', num_worker_preprocess=1, minibatch_size=4)
    try:
        assert executor.access_paths == '@r' and executor.minibatch_size == 4
    finally:
        executor.close()
    with pytest.raises(InvalidParameterError, match='minibatchsize'):
        CLIPEncoder(name=TINY, minibatchsize=4)


def test_closing_the_executor_stops_the_pipeline_then_closes_the_backend():
    executor = CLIPEncoder(name=TINY)
    order = []
    pipeline_close, backend_close = executor.pipeline.close, executor.backend.close
    executor.pipeline.close = lambda: (order.append('pipeline'), pipeline_close())
    executor.backend.close = lambda: (order.append('backend'), backend_close())
    executor.close()
    assert order == ['pipeline', 'backend']
    assert executor.pipeline.scheduler._closed  # no forward pass can start after
    assert not executor.pipeline.scheduler._thread.is_alive()


@pytest.mark.parametrize('native', [True, False])
def test_the_default_precision_and_its_reason_are_in_the_ready_line_and_info(native, monkeypatch):
    from clipserve.backends import precision

    monkeypatch.setenv(precision.CPU_BF16_ENV, '1' if native else '0')
    precision.cpu_bf16.cache_clear()
    seen = []
    original = logging.Logger.info
    monkeypatch.setattr(
        logging.Logger, 'info', lambda self, msg, *a, **k: (seen.append(str(msg)), original(self, msg, *a, **k))
    )
    try:
        executor = CLIPEncoder(name=TINY)
    finally:
        precision.cpu_bf16.cache_clear()
    try:
        info = executor.info()
        want = ('bf16', 'bf16') if native else ('fp32', 'fp32')
        assert (info['precision']['images'], info['precision']['texts']) == want
        assert ('forced on' if native else 'forced off') in info['precision']['reason']
        assert info['dtype'] == ('bf16' if native else 'fp32')
    finally:
        executor.close()
    ready = [line for line in seen if line.startswith('ready in')]
    assert ready and info['dtype'] in ready[0] and info['precision']['reason'] in ready[0]
