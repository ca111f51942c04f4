"""The answers of the gateway's `/v1/*` routes in OpenAI's shapes, as plain data (no Jina, no sockets).

Embeddings as OpenAI answers them (L2-normalised float32, kept as float32 arrays for json_render.py to write
in their shortest float32 form; base64 as its SDK decodes it: little-endian float32), `usage`, the rank
answer in the style of the rerank APIs, and the model list.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np

from clipserve.config.parameters import MULTI_VECTOR_PARAMETER
from clipserve.serving.gateway.openai_api import MODALITIES


def l2_normalise(vectors) -> np.ndarray:
    """Rows scaled to unit length (as OpenAI's embeddings are), in float32; an all-zero row stays zero."""
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def encode_base64(vector) -> str:
    """base64 of the little-endian float32 bytes: what OpenAI answers and its SDK decodes."""
    return base64.b64encode(np.asarray(vector, dtype='<f4').tobytes()).decode('ascii')


def decode_base64(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype='<f4')


def usage(prompt_tokens: int) -> dict:
    return {'prompt_tokens': int(prompt_tokens), 'total_tokens': int(prompt_tokens)}


def embeddings_response(vectors, model: str, encoding_format: str, prompt_tokens: int) -> dict:
    """OpenAI's answer: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], ...}."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    rows = [encode_base64(v) for v in vectors] if encoding_format == 'base64' else list(vectors)
    return {
        'object': 'list',
        'data': [{'object': 'embedding', 'index': i, 'embedding': row} for i, row in enumerate(rows)],
        'model': model,
        'usage': usage(prompt_tokens),
    }


def multivector_response(arrays, model: str, encoding_format: str, prompt_tokens: int) -> dict:
    """/v1/embeddings with `return_multivector`: each input's [tokens, dim] vectors (rendered as a list of
    rows), or as base64 of its row-major little-endian float32 bytes with its `shape`."""
    data = []
    for i, array in enumerate(arrays):
        array = np.ascontiguousarray(array, dtype=np.float32)
        row = {'object': 'embedding', 'index': i, 'shape': list(array.shape)}
        row['embedding'] = encode_base64(array.ravel()) if encoding_format == 'base64' else array
        data.append(row)
    return {'object': 'list', 'data': data, 'model': model, 'usage': usage(prompt_tokens)}


@dataclass(frozen=True)
class RankResult:
    index: int
    clip_score: float | None  # softmax of 100 x cosine over the request's documents, as /rank computes it
    clip_score_cosine: float | None
    siglip_score: float | None = None  # SigLIP models: the model's own match probability
    maxsim_score: float | None = None  # late-interaction models (ColPali): their only score


def rank_result(index: int, scores: dict[str, float]) -> RankResult:
    """One ranked document from /rank's scores by name (request_documents.match_scores)."""
    if 'maxsim_score' in scores:
        return RankResult(index, None, None, maxsim_score=scores['maxsim_score'])
    return RankResult(index, scores['clip_score'], scores['clip_score_cosine'], scores.get('siglip_score'))


def rank_response(results: list[RankResult], model: str, prompt_tokens: int, top_n: int | None = None) -> dict:
    """Results best first (the order /rank sorts them in), cut to `top_n`. `relevance_score` is
    `clip_score` (a late-interaction model's `maxsim_score`), under the name rerank clients read."""
    rows = []
    for r in results[:top_n] if top_n else results:
        if r.maxsim_score is not None:
            rows.append({'index': r.index, 'relevance_score': r.maxsim_score, 'maxsim_score': r.maxsim_score})
            continue
        row = {
            'index': r.index,
            'relevance_score': r.clip_score,
            'clip_score': r.clip_score,
            'clip_score_cosine': r.clip_score_cosine,
        }
        if r.siglip_score is not None:
            row['siglip_score'] = r.siglip_score
        rows.append(row)
    return {'object': 'rerank', 'model': model, 'results': rows, 'usage': usage(prompt_tokens)}


@dataclass(frozen=True)
class ServedModel:
    """One model of the Flow, as its encoder reports it (`/clipserve/info`)."""

    name: str  # canonical: what /encode/<name> routes by
    embed_dim: int
    aliases: tuple[str, ...] = ()  # other names it answers to (as configured, e.g. ViT-B/32)
    default: bool = False  # answers requests that name no model
    late_interaction: bool = False  # [tokens, dim] per input (return_multivector), MaxSim ranking
    modalities: tuple[str, ...] = MODALITIES


def models_response(
    models: list[ServedModel], created: int, search: bool = False, rerankers: tuple[str, ...] = ()
) -> dict:
    """GET /v1/models: OpenAI's list of model objects, with each model's embedding size and modalities, and what
    else the Flow answers (`capabilities`: an index for /v1/search, cross-encoders for the rerank routes), which
    the playground reads; OpenAI's SDK ignores the extra field."""
    return {
        'object': 'list',
        'capabilities': {'search': search, 'rerankers': list(rerankers)},
        'data': [
            {
                'id': m.name,
                'object': 'model',
                'created': int(created),
                'owned_by': 'clipserve',
                'embedding_dimensions': m.embed_dim,
                'modalities': list(m.modalities),
                'aliases': list(m.aliases),
                'default': m.default,
                MULTI_VECTOR_PARAMETER: m.late_interaction,
            }
            for m in models
        ],
    }


def finite(value: float) -> float:
    """JSON has no NaN or infinity; a score that is not finite (it should never be) becomes 0."""
    return float(value) if math.isfinite(value) else 0.0
