"""The /rank math on plain arrays: cosine, softmax of 100 x cosine, MaxSim, and a stable descending order.

These are clip-as-service's semantics exactly: DocArray v1's cosine formula (with its 1e-7 guards,
clipped to [-1, 1]) and a fixed logit scale of 100 (not the model's learned one), softmax taken
over one query's own matches only. Late-interaction models (ColPali, ColQwen2) score with MaxSim instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from clipserve.engine.token_vectors import pad_vectors

LOGIT_SCALE = 100.0
_EPS = 1e-7


def cosine(query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Cosine between one query [D] and each candidate [N, D] -> [N], in [-1, 1]."""
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    c = np.asarray(candidates, dtype=np.float64).reshape(len(candidates), -1)
    if c.shape[1] != q.shape[0]:
        raise ValueError(f'query has dimension {q.shape[0]} but candidates have {c.shape[1]}')
    dots = c @ q
    norms = np.linalg.norm(c, axis=1) * np.linalg.norm(q)
    return np.clip((dots + _EPS) / (norms + _EPS), -1.0, 1.0)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis."""
    x = np.asarray(logits, dtype=np.float64)
    if x.shape[-1] == 0:
        raise ValueError('softmax of an empty array')
    shifted = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=-1, keepdims=True)


def clip_scores(query: np.ndarray, candidates: np.ndarray, logit_scale: float = LOGIT_SCALE):
    """(softmax(logit_scale * cosine), cosine) for one query against its own candidates."""
    cos = cosine(query, candidates)
    return softmax(logit_scale * cos), cos


def sigmoid_scores(cosines: np.ndarray, logit_scale: float, logit_bias: float) -> np.ndarray:
    """SigLIP's own probability that each pair matches: sigmoid(scale x cosine + bias), with the model's
    learned scale (already exponentiated) and bias; independent per pair, unlike the softmax."""
    logits = float(logit_scale) * np.asarray(cosines, dtype=np.float64) + float(logit_bias)
    return 1.0 / (1.0 + np.exp(-logits))


#: the most float32 similarities one MaxSim step holds (64 MB): pages are scored in chunks below it
MAXSIM_CHUNK_ELEMENTS = 16 * 1024 * 1024


def maxsim(queries: Sequence[np.ndarray], pages: Sequence[np.ndarray]) -> np.ndarray:
    """Late interaction's score of every query against every page, [Q, N] float64: for each of a query's
    vectors [L_q, D], the best dot product over the page's vectors [T_n, D], summed over the query's vectors.

    Batched: queries and pages are padded into two arrays with masks (token_vectors.pad_vectors), one matrix
    product gives every query vector against every page vector of a chunk of pages, padded page vectors
    never win the max (-inf) and padded query vectors add nothing; no Python loop per pair.
    """
    q, q_mask = pad_vectors(queries)
    p, p_mask = pad_vectors(pages)
    if q.shape[2] != p.shape[2]:
        raise ValueError(f'queries have dimension {q.shape[2]} but pages have {p.shape[2]}')
    (count, length, dim), tokens = q.shape, p.shape[1]
    flat = q.reshape(count * length, dim)
    step = max(1, MAXSIM_CHUNK_ELEMENTS // max(1, count * length * tokens))
    out = np.empty((count, len(p)), dtype=np.float64)
    for start in range(0, len(p), step):
        chunk, mask = p[start : start + step], p_mask[start : start + step]
        sims = (flat @ chunk.reshape(-1, dim).T).reshape(count, length, len(chunk), tokens)
        sims = np.where(mask[None, None], sims, -np.inf)
        best = sims.max(axis=-1).astype(np.float64)  # [Q, L, n]: each query vector's best match per page
        out[:, start : start + len(chunk)] = np.where(q_mask[..., None], best, 0.0).sum(axis=1)
    return out


def maxsim_scores(query: np.ndarray, pages: Sequence[np.ndarray]) -> np.ndarray:
    """MaxSim of one query's vectors [L, D] against each page's [T_n, D] -> [N]."""
    return maxsim([query], pages)[0]


def descending_order(scores: np.ndarray) -> np.ndarray:
    """Indices that sort `scores` from high to low, ties kept in input order."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind='stable')
