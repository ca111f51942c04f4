"""The OpenAI-compatible routes' request bodies and answers (the server's serving/gateway/openai_api.py), as plain data.

Embeddings are asked for as base64 (little-endian float32, as OpenAI's SDK decodes it): exact and a
third of the size of JSON numbers. Answers are checked against what was sent, so a wrong server behind
the address is an UnexpectedAnswerError, never misaligned vectors.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from clipserve_client.errors import UnexpectedAnswerError

EMBEDDINGS, MODELS, RANK = '/v1/embeddings', '/v1/models', '/v1/rank'
SCORES = ('clip_score', 'clip_score_cosine', 'relevance_score', 'siglip_score')


def embeddings_body(items: list[dict], model: str | None) -> dict:
    body = {'input': items, 'encoding_format': 'base64'}
    if model:
        body['model'] = model
    return body


def read_embeddings(answer: dict, count: int) -> np.ndarray:
    """[count, D] float32 in the order sent (the answer's `index`), L2-normalised by the server."""
    rows = answer.get('data')
    if not isinstance(rows, list) or len(rows) != count:
        got = len(rows) if isinstance(rows, list) else 'no'
        raise UnexpectedAnswerError(f'{EMBEDDINGS} answered {got} embeddings for {count} inputs')
    vectors: list[np.ndarray | None] = [None] * count
    for row in rows:
        index = row.get('index') if isinstance(row, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or vectors[index] is not None:
            raise UnexpectedAnswerError(f'{EMBEDDINGS} answered an embedding with a bad index: {index!r}')
        vectors[index] = _vector(row.get('embedding'))
    if len({v.shape for v in vectors}) != 1:
        raise UnexpectedAnswerError(f'{EMBEDDINGS} answered embeddings of different sizes')
    return np.stack(vectors)


def _vector(value) -> np.ndarray:
    if isinstance(value, str):
        try:
            return np.frombuffer(base64.b64decode(value, validate=True), dtype='<f4').astype(np.float32)
        except (binascii.Error, ValueError) as err:
            raise UnexpectedAnswerError(
                f'{EMBEDDINGS} answered an embedding that is not base64 float32: {err}'
            ) from None
    if isinstance(value, list):
        return np.asarray(value, dtype=np.float32)
    raise UnexpectedAnswerError(f'{EMBEDDINGS} answered an embedding of type {type(value).__name__}')


def rank_body(query: dict, documents: list[dict], model: str | None) -> dict:
    body = {'query': query, 'documents': documents}
    if model:
        body['model'] = model
    return body


def read_scores(answer: dict, count: int, score: str) -> np.ndarray:
    """The `score` of each document, in the order the documents were sent (the server sorts best first)."""
    results = answer.get('results')
    if not isinstance(results, list) or len(results) != count:
        got = len(results) if isinstance(results, list) else 'no'
        raise UnexpectedAnswerError(f'{RANK} answered {got} results for {count} documents')
    scores = np.full(count, np.nan, dtype=np.float64)
    for result in results:
        index = result.get('index') if isinstance(result, dict) else None
        if not isinstance(index, int) or not 0 <= index < count:
            raise UnexpectedAnswerError(f'{RANK} answered a result with a bad index: {index!r}')
        if score not in result:
            raise ValueError(
                f"the server's answer has no {score!r} (this model gives {sorted(set(result) & set(SCORES))})"
            )
        scores[index] = float(result[score])
    return scores


@dataclass(frozen=True)
class Model:
    """One model the server serves (GET /v1/models)."""

    id: str  # what `model=` names
    embedding_dimensions: int
    modalities: tuple[str, ...] = ('text', 'image')
    aliases: tuple[str, ...] = ()
    default: bool = False  # answers requests that name no model


def read_models(answer: dict) -> list[Model]:
    rows = answer.get('data')
    if not isinstance(rows, list):
        raise UnexpectedAnswerError(f'{MODELS} answered no model list')
    try:
        return [
            Model(
                id=str(row['id']),
                embedding_dimensions=int(row['embedding_dimensions']),
                modalities=tuple(row.get('modalities') or ('text', 'image')),
                aliases=tuple(row.get('aliases') or ()),
                default=bool(row.get('default', False)),
            )
            for row in rows
        ]
    except (KeyError, TypeError, ValueError) as err:
        raise UnexpectedAnswerError(f'{MODELS} answered a model without {err}: is this a clipserve gateway?') from None


# ---- search and rerank ------------------------------------------------------------------------------

SEARCH, RERANK = '/v1/search', '/v1/rerank'


@dataclass(frozen=True)
class Reranked:
    """One document of a rerank answer: its position in the request, and the reranker's score (0-1)."""

    index: int
    relevance_score: float


def rerank_body(query: str, documents: list[str], model: str | None, top_n: int | None, max_length: int | None) -> dict:
    if (
        not isinstance(query, str)
        or isinstance(documents, (str, bytes))
        or not all(isinstance(d, str) for d in documents)
    ):
        raise TypeError('rerank() takes a text query and a list of texts')
    if not documents:
        raise ValueError('rerank() needs at least one document')
    body = {'query': query, 'documents': list(documents)}
    for name, value in (('model', model), ('top_n', top_n), ('max_length', max_length)):
        if value is not None:
            body[name] = value
    return body


def read_reranked(answer: dict, count: int) -> list[Reranked]:
    """The answer's results, best first, checked against the documents sent."""
    results = answer.get('results')
    if not isinstance(results, list) or len(results) > count:
        raise UnexpectedAnswerError(f'{RERANK} answered {len(results) if isinstance(results, list) else "no"} results')
    out = []
    for result in results:
        index = result.get('index') if isinstance(result, dict) else None
        if not isinstance(index, int) or not 0 <= index < count:
            raise UnexpectedAnswerError(f'{RERANK} answered a result with a bad index: {index!r}')
        out.append(Reranked(index, float(result['relevance_score'])))
    return out


@dataclass(frozen=True)
class Found:
    """One search result: the document's id, its similarity to the query (larger is closer), what was stored
    with it, and its reranker score when the search reranked."""

    id: str
    score: float
    text: str | None = None
    uri: str | None = None
    tags: dict | None = None
    rerank_score: float | None = None


def search_body(query: dict | None, vector, top_k: int, filter: dict | None, rerank, model: str | None) -> dict:
    if (query is None) == (vector is None):
        raise ValueError('search() takes a query (a text or an image) or a vector, not both')
    body = {'top_k': int(top_k)}
    if query is not None:
        body['query'] = query
    else:
        body['vector'] = [float(v) for v in np.asarray(vector, dtype=np.float64).ravel()]
    if filter:
        body['filter'] = filter
    if rerank:
        body['rerank'] = rerank if isinstance(rerank, dict) else True
    if model:
        body['model'] = model
    return body


def read_found(answer: dict) -> list[Found]:
    results = answer.get('results')
    if not isinstance(results, list):
        raise UnexpectedAnswerError(f'{SEARCH} answered no results list')
    return [
        Found(
            id=str(r['id']),
            score=float(r['score']),
            text=r.get('text'),
            uri=r.get('uri'),
            tags=r.get('tags'),
            rerank_score=r.get('rerank_score'),
        )
        for r in results
    ]
