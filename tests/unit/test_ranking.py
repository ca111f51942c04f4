import numpy as np
import pytest

from clipserve.engine import ranking


def test_cosine_matches_docarray_v1_formula():
    from docarray.math.distance.numpy import cosine as docarray_cosine

    rng = np.random.default_rng(0)
    q, c = rng.normal(size=(1, 16)), rng.normal(size=(5, 16))
    expected = np.clip(1 - docarray_cosine(q, c)[0], -1, 1)
    np.testing.assert_allclose(ranking.cosine(q[0], c), expected, atol=1e-12)


def test_scores_sum_to_one_and_follow_cosine():
    rng = np.random.default_rng(1)
    q, c = rng.normal(size=32), rng.normal(size=(7, 32))
    p, cos = ranking.clip_scores(q, c)
    assert abs(p.sum() - 1) < 1e-12
    assert np.all((cos >= -1) & (cos <= 1))
    np.testing.assert_allclose(p, np.exp(100 * cos) / np.exp(100 * cos).sum(), rtol=1e-9)


def test_softmax_is_stable_for_extreme_values():
    p = ranking.softmax(np.array([1e6, 1e6 - 1, -1e6]))
    assert np.all(np.isfinite(p)) and abs(p.sum() - 1) < 1e-12
    assert p[0] > p[1] > p[2]
    np.testing.assert_allclose(ranking.softmax(np.array([-1e308, -1e308])), [0.5, 0.5])


def test_identical_vectors_and_opposites():
    v = np.array([1.0, 2.0, 3.0])
    p, cos = ranking.clip_scores(v, np.stack([v, -v, 2 * v]))
    np.testing.assert_allclose(cos, [1, -1, 1], atol=1e-7)
    np.testing.assert_allclose(p[[0, 2]], [0.5, 0.5], atol=1e-7)


def test_zero_vectors_do_not_produce_nan():
    p, cos = ranking.clip_scores(np.zeros(4), np.ones((3, 4)))
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(cos))


def test_ties_keep_input_order():
    assert ranking.descending_order(np.array([0.2, 0.5, 0.2, 0.5, 0.1])).tolist() == [1, 3, 0, 2, 4]


def test_empty_and_mismatched_inputs_raise():
    with pytest.raises(ValueError):
        ranking.softmax(np.array([]))
    with pytest.raises(ValueError, match='dimension'):
        ranking.cosine(np.ones(3), np.ones((2, 4)))


def test_single_match_gets_probability_one():
    p, _ = ranking.clip_scores(np.ones(3), np.ones((1, 3)))
    assert p.tolist() == [1.0]


def test_sigmoid_scores_are_siglips_probability_per_pair():
    from clipserve.engine.ranking import sigmoid_scores

    cosines = np.array([0.5, 0.0, -0.2])
    got = sigmoid_scores(cosines, logit_scale=10.0, logit_bias=-3.0)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(10.0 * cosines - 3.0))))
    assert got[0] > 0.8 and got[1] < 0.05  # independent per pair: they need not sum to 1
