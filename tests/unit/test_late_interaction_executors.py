"""A late-interaction model (tiny ColQwen2, built by the tests) behind CLIPEncoder and CLIPRanker, in-process:
[tokens, dim] embeddings only for requests that opt in (clip-client's /encode refused by naming the parameter),
page pooling, /rank by MaxSim against a per-pair NumPy loop, stored multi-vector embeddings reused and checked,
and the info a gateway reads. Over gRPC and HTTP: tests/integration/test_late_interaction_flow.py."""

import numpy as np
import pytest
from docarray import Document, DocumentArray

from clipserve import CLIPEncoder, CLIPRanker
from clipserve.errors import InvalidDocumentError, InvalidParameterError

from ..late_interaction_folders import EMBEDDING_DIM, late_interaction_checkpoint

pytest.importorskip('transformers')

PAGES = [(40, 52), (64, 20), (33, 33)]  # (width, height): ColQwen2 gives each its own number of vectors


def numpy_maxsim(query, page) -> float:
    """MaxSim by hand: each query vector's best dot product over the page's vectors, summed."""
    return float(sum(max(float(q @ p) for p in np.asarray(page, np.float64)) for q in np.asarray(query, np.float64)))


def page_images(sizes=PAGES):
    rng = np.random.default_rng(9)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]


@pytest.fixture(scope='module')
def name(tmp_path_factory):
    return f'transformers:{late_interaction_checkpoint(tmp_path_factory.mktemp("late") / "colqwen2", "colqwen2")}'


@pytest.fixture(scope='module')
def encoder(name):
    executor = CLIPEncoder(name=name, dtype='fp32', minibatch_size=4)
    yield executor
    executor.close()


@pytest.fixture(scope='module')
def ranker(name):
    executor = CLIPRanker(name=name, dtype='fp32', minibatch_size=4)
    yield executor
    executor.close()


def test_encode_refuses_clip_clients_request_and_names_the_parameter(encoder):
    docs = DocumentArray([Document(text='a query')])
    with pytest.raises(InvalidParameterError, match='multi_vector=true') as caught:
        encoder.encode(docs, {'drop_image_content': True})  # what clip-client sends
    assert 'late-interaction' in str(caught.value) and docs[0].embedding is None
    with pytest.raises(InvalidParameterError, match='multi_vector'):
        encoder.encode_endpoint(docs, {'multi_vector': 'maybe'})


def test_encode_with_the_opt_in_gives_each_document_its_own_tokens(encoder):
    docs = DocumentArray([Document(text='a short query'), Document(text='a much longer query about revenue in 2020')])
    docs.extend(Document(tensor=image) for image in page_images())
    encoder.encode(docs, {'multi_vector': True})
    shapes = [d.embedding.shape for d in docs]
    assert all(len(s) == 2 and s[1] == EMBEDDING_DIM for s in shapes)
    assert shapes[0][0] < shapes[1][0]  # one vector per token, padding dropped
    assert len({s[0] for s in shapes[2:]}) > 1  # ColQwen2 pages: tokens by image size
    for doc in docs:
        np.testing.assert_allclose(np.linalg.norm(doc.embedding, axis=1), 1.0, atol=1e-5)
    assert encoder.info()['multi_vector'] is True and encoder.info()['embed_dim'] == EMBEDDING_DIM


def test_pool_factor_pools_pages_only(encoder):
    plain = DocumentArray([Document(text='a query'), Document(tensor=page_images()[0])])
    pooled = DocumentArray([Document(text='a query'), Document(tensor=page_images()[0])])
    encoder.encode(plain, {'multi_vector': True})
    encoder.encode(pooled, {'multi_vector': True, 'pool_factor': 2})
    assert pooled[0].embedding.shape == plain[0].embedding.shape  # queries never pooled
    assert pooled[1].embedding.shape[0] == plain[1].embedding.shape[0] // 2
    with pytest.raises(InvalidParameterError, match='pool_factor'):
        encoder.encode(plain, {'multi_vector': True, 'pool_factor': 0})


def test_rank_scores_by_maxsim_and_sorts(encoder):
    pages = [Document(id=f'page{i}', tensor=image) for i, image in enumerate(page_images())]
    pages.append(Document(id='text-page', text='quarterly revenue table'))
    queries = DocumentArray([Document(text=q, matches=DocumentArray(pages, copy=True)) for q in ('revenue', 'a cat')])
    encoder.rank(queries, {})  # no opt-in needed: /rank answers with scores, not embeddings
    reference = DocumentArray(
        [Document(text=q) for q in ('revenue', 'a cat')] + [Document(p, copy=True) for p in pages]
    )
    encoder.encode(reference, {'multi_vector': True})
    vectors = {d.id: d.embedding for d in reference[2:]}
    for query, plain in zip(queries, reference[:2]):
        want = {pid: numpy_maxsim(plain.embedding, v) for pid, v in vectors.items()}
        got = {m.id: m.scores['maxsim_score'].value for m in query.matches}
        assert got == pytest.approx(want, rel=1e-5)
        assert [m.id for m in query.matches] == sorted(want, key=lambda pid: -want[pid])
        assert all(m.embedding is None and 'clip_score' not in m.scores for m in query.matches)


def test_ranker_reuses_stored_multi_vector_embeddings_and_checks_them(encoder, ranker):
    stored = DocumentArray([Document(id=f'p{i}', tensor=image) for i, image in enumerate(page_images())])
    encoder.encode(stored, {'multi_vector': True, 'pool_factor': 2})  # pooled for storage
    queries = DocumentArray([Document(text='revenue', matches=DocumentArray(stored, copy=True))])
    before = ranker.backend.model_calls
    ranker.rank(queries, {})
    assert ranker.backend.model_calls - before == 1  # the query only: the pages' vectors are reused
    query_vectors = DocumentArray([Document(text='revenue')])
    encoder.encode(query_vectors, {'multi_vector': True})
    for match in queries[0].matches:
        page = stored[match.id].embedding
        assert match.scores['maxsim_score'].value == pytest.approx(
            numpy_maxsim(query_vectors[0].embedding, page), rel=1e-5
        )
    bad = DocumentArray([Document(text='q', matches=[Document(id='flat', embedding=np.ones(EMBEDDING_DIM))])])
    with pytest.raises(InvalidDocumentError, match=r'flat.*\[tokens, 16\]'):
        ranker.rank(bad, {})
