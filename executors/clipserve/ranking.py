"""The /rank math on plain arrays: cosine, softmax of 100 x cosine, and a stable descending order.

These are clip-as-service's semantics exactly: DocArray v1's cosine formula (with its 1e-7 guards,
clipped to [-1, 1]) and a fixed logit scale of 100 (not the model's learned one), softmax taken
over one query's own matches only.
"""

from __future__ import annotations

import numpy as np

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


def descending_order(scores: np.ndarray) -> np.ndarray:
    """Indices that sort `scores` from high to low, ties kept in input order."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind='stable')
