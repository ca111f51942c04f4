"""Multi-vector embeddings: the output a model config declares (models/outputs.py); in the engine, padding rows
dropped per document and put back with masks, batched
MaxSim against a plain per-pair loop in NumPy, token pooling (Ward clustering) against a brute-force
reference, and fp16 / int8 storage."""

import numpy as np
import pytest

from clipserve.engine import ranking
from clipserve.engine.token_pooling import pool_tokens, ward_clusters
from clipserve.engine.token_vectors import as_vectors, pad_vectors, token_rows
from clipserve.engine.vector_storage import load, store
from clipserve.models.outputs import OneVectorOutput, TokenVectorsOutput, declared_output


def _unit(rng, rows, dim=16):
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference_maxsim(query, page) -> float:
    """MaxSim by hand: for each query vector, the best dot product over the page's vectors, summed."""
    total = 0.0
    for q in np.asarray(query, np.float64):
        total += max(float(q @ p) for p in np.asarray(page, np.float64))
    return total


def test_a_model_config_declares_its_output_and_a_pass_is_fitted_to_it():
    assert declared_output({'embed_dim': 16}) == OneVectorOutput() and not OneVectorOutput().late_interaction
    pages = declared_output({'embed_dim': 16, 'multi_vector': True, 'image_tokens': 6})
    assert pages == TokenVectorsOutput(image_tokens=6) and pages.late_interaction
    assert OneVectorOutput().row_shape('images', 16, 77) == (16,)
    assert pages.row_shape('images', 16, 77) == (6, 16) and pages.row_shape('texts', 16, 77) == (77, 16)
    texts = np.ones((2, 5, 16), np.float32)  # a trimmed text pass: 5 of 9 token rows
    fitted = pages.fit(texts, 'texts', 9)
    assert fitted.shape == (2, 9, 16) and not fitted[:, 5:].any() and fitted[:, :5].all()
    assert pages.fit(np.ones((2, 6, 16)), 'images', 9).shape == (2, 6, 16)
    with pytest.raises(ValueError, match='7 token rows per image, over 6'):
        pages.fit(np.ones((1, 7, 16)), 'images', 9)


def test_token_rows_drop_each_documents_padding_and_pad_vectors_puts_it_back():
    rng = np.random.default_rng(0)
    docs = [_unit(rng, n) for n in (3, 7, 1)]
    batch = np.zeros((3, 9, 16), np.float32)
    for row, doc in zip(batch, docs):
        row[: len(doc)] = doc
    rows = token_rows(batch)
    assert [r.shape for r in rows] == [(3, 16), (7, 16), (1, 16)]
    for got, want in zip(rows, docs):
        np.testing.assert_array_equal(got, want)
    padded, mask = pad_vectors(rows)
    assert padded.shape == (3, 7, 16) and mask.sum(1).tolist() == [3, 7, 1]
    np.testing.assert_array_equal(padded[~mask], 0)
    with pytest.raises(ValueError, match='different dimensions'):
        pad_vectors([np.ones((2, 4)), np.ones((2, 5))])
    with pytest.raises(ValueError, match='non-empty'):
        pad_vectors([np.ones((0, 4))])


def test_as_vectors_checks_what_a_client_stored():
    assert as_vectors(np.ones((3, 8), np.float16), 8).dtype == np.float32
    for bad, message in (
        (np.ones(8), r'shape \[8\]'),
        (np.ones((3, 4)), r'\[tokens, 8\]'),
        (np.full((2, 8), np.nan), 'NaN'),
        (np.array([['a'] * 8]), 'numbers'),
    ):
        with pytest.raises(ValueError, match=message):
            as_vectors(bad, 8)


@pytest.mark.parametrize('chunk', [ranking.MAXSIM_CHUNK_ELEMENTS, 1])  # all pages at once, and one page per step
def test_batched_maxsim_equals_the_per_pair_loop(chunk, monkeypatch):
    monkeypatch.setattr(ranking, 'MAXSIM_CHUNK_ELEMENTS', chunk)
    rng = np.random.default_rng(1)
    queries = [_unit(rng, n) for n in (5, 1, 12)]
    pages = [_unit(rng, n) for n in (30, 2, 17, 1, 30)]
    pages[1] = -pages[1]  # a page whose vectors all point away: the padding's zeros must not win the max
    got = ranking.maxsim(queries, pages)
    want = np.array([[_reference_maxsim(q, p) for p in pages] for q in queries])
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ranking.maxsim_scores(queries[2], pages), want[2], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='dimension'):
        ranking.maxsim(queries, [_unit(rng, 3, 8)])


def _brute_ward(x, clusters):
    """Ward's clustering the slow way: every step, merge the pair whose merge adds the least squared error."""
    groups = [[i] for i in range(len(x))]
    while len(groups) > clusters:
        best = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                ga, gb = x[groups[a]], x[groups[b]]
                gap = ga.mean(0) - gb.mean(0)
                cost = len(ga) * len(gb) / (len(ga) + len(gb)) * float(gap @ gap)
                if best is None or cost < best[0]:
                    best = (cost, a, b)
        _, a, b = best
        groups[a] += groups.pop(b)
    return sorted(sorted(g) for g in groups)


def test_ward_clusters_equal_the_brute_force_merges():
    rng = np.random.default_rng(2)
    for rows, clusters in ((12, 4), (20, 7), (9, 1)):
        x = _unit(rng, rows, 6).astype(np.float64)
        owner = ward_clusters(x, clusters)
        got = sorted(sorted(np.flatnonzero(owner == label).tolist()) for label in np.unique(owner))
        assert got == _brute_ward(x, clusters)


def test_pooling_merges_near_copies_first_and_keeps_unit_vectors_in_page_order():
    rng = np.random.default_rng(3)
    distinct = _unit(rng, 4, 32)
    noisy = np.repeat(distinct, 3, axis=0) + 1e-3 * rng.standard_normal((12, 32)).astype(np.float32)
    pooled = pool_tokens(noisy, 3)
    assert pooled.shape == (4, 32)
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-6)
    assert (pooled * distinct).sum(1).min() > 0.999  # each cluster is one of the originals, in order
    np.testing.assert_array_equal(pool_tokens(noisy, 1), noisy)
    assert pool_tokens(noisy[:2], 3).shape == (1, 32)  # at least one vector
    with pytest.raises(ValueError, match='at least 1'):
        pool_tokens(noisy, 0)


def test_pooling_a_page_sized_input_is_fast_enough_to_serve():
    import time

    page = _unit(np.random.default_rng(4), 1030, 128)
    started = time.perf_counter()
    pooled = pool_tokens(page, 3)
    assert pooled.shape == (343, 128)
    assert time.perf_counter() - started < 5  # ~0.3 s here; a page's forward pass takes seconds


@pytest.mark.parametrize('dtype, bytes_per_value, worst', [('fp32', 4, 0.0), ('fp16', 2, 1e-3), ('int8', 1, 0.02)])
def test_storage_dtypes_shrink_the_vectors_within_their_rounding(dtype, bytes_per_value, worst):
    page = _unit(np.random.default_rng(5), 50, 128)
    stored = store(page, dtype)
    assert stored.values.nbytes == 50 * 128 * bytes_per_value
    back = load(stored)
    assert back.dtype == np.float32
    error = np.linalg.norm(back - page, axis=1).max()
    assert error <= worst and (dtype == 'fp32') == (error == 0)
    with pytest.raises(ValueError, match='fp32, fp16, int8'):
        store(page, 'int4')
