"""POST /v1/search: a query (a text, an image, or a vector) against the Flow's index, as data.

    {"query": "a dog on a beach", "top_k": 10, "filter": {"kind": {"$eq": "photo"}}, "return_payload": true}
    {"query": {"image": "data:image/png;base64,..."}}     or any item form /v1/embeddings takes
    {"vector": [0.01, -0.2, ...]}                          a vector instead of a query: no encoding
    {"query": "...", "top_k": 100, "rerank": {"top_n": 10, "model": ...}}   retrieve 100, rerank their captions

-> {"object": "list", "model": ..., "metric": "cosine", "results": [{"id", "score", "text"?, "uri"?, "tags"?}],
    "usage": {...}}, best first. `score` is a similarity, larger is closer: cosine similarity, dot product or
MaxSim (a euclidean index answers the negated distance). `filter` is clip-as-service's (AnnLite's) syntax or
Qdrant's own (index/filters.py); `return_payload` is true (text, uri, tags), false (ids and scores) or a list
of those fields; `ef_search` trades speed for recall; `rerank` (`true` or `{"model", "top_n"}`) reranks the
candidates' captions with the Flow's cross-encoder (flows/search-rerank.yml), each reranked result then carries
its `rerank_score`. No Jina here: search_calls.py makes the calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clipserve.errors import InvalidParameterError
from clipserve.index.filters import to_qdrant
from clipserve.serving.gateway.api_error import bad_request
from clipserve.serving.gateway.openai_answers import usage
from clipserve.serving.gateway.openai_api import SEARCH_PATH, Item, _modality, _model, _object, parse_item

__all__ = ['SEARCH_PATH', 'SearchRequest', 'parse_search_request', 'search_response']
MAX_TOP_K = 1000
PAYLOAD_FIELDS = ('text', 'uri', 'tags')
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class Rerank:
    model: str | None = None  # None: the Flow's reranker
    top_n: int | None = None  # None: every candidate


@dataclass(frozen=True)
class SearchRequest:
    query: Item | None  # None: `vector` is the query
    vector: list[float] | None
    top_k: int
    filter: dict | None
    payload: tuple[str, ...]
    model: str | None
    ef_search: int | None = None
    rerank: Rerank | None = None


def parse_search_request(
    body, max_image_bytes: int = 1 << 62, max_inputs: int = 1, max_dim: int = 65_536
) -> SearchRequest:
    """The body of POST /v1/search (one query, whatever `max_inputs`); an APIError (400) naming the field it
    cannot read."""
    body = _object(body)
    has_query, has_vector = body.get('query') is not None, body.get('vector') is not None
    if has_query == has_vector:
        raise bad_request("send exactly one of 'query' (a text or an image) and 'vector' (a list of numbers)", 'query')
    query = vector = None
    if has_query:
        if isinstance(body['query'], list):
            raise bad_request("'query' must be one text or image, not a list", 'query')
        query = parse_item(body['query'], 'query', _modality(body), max_image_bytes)
    else:
        vector = _vector(body['vector'], max_dim)
    return SearchRequest(
        query=query,
        vector=vector,
        top_k=_count(body.get('top_k', body.get('limit', DEFAULT_TOP_K)), 'top_k', MAX_TOP_K),
        filter=_filter(body.get('filter')),
        payload=_payload(body.get('return_payload', True)),
        model=_model(body),
        ef_search=None if body.get('ef_search') is None else _count(body['ef_search'], 'ef_search', 100_000),
        rerank=_rerank(body.get('rerank')),
    )


def _rerank(value) -> Rerank | None:
    if value is None or value is False:
        return None
    if value is True:
        return Rerank()
    if not isinstance(value, dict) or set(value) - {'model', 'top_n'}:
        raise bad_request('\'rerank\' must be true or {"model": ..., "top_n": ...}', 'rerank')
    model = value.get('model')
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise bad_request(f"'rerank.model' must be a reranker's name, got {model!r}", 'rerank.model')
    top_n = value.get('top_n')
    return Rerank(model=model, top_n=None if top_n is None else _count(top_n, 'rerank.top_n', MAX_TOP_K))


def _vector(value, max_dim: int) -> list[float]:
    ok = isinstance(value, list) and 0 < len(value) <= max_dim
    ok = ok and all(not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) for v in value)
    if not ok:
        raise bad_request(f"'vector' must be a non-empty list of at most {max_dim} finite numbers", 'vector')
    return [float(v) for v in value]


def _count(value, param: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise bad_request(f"'{param}' must be an integer from 1 to {most}, got {value!r}", param)
    return value


def _filter(value) -> dict | None:
    try:
        return to_qdrant(value, 'filter')
    except InvalidParameterError as error:
        raise bad_request(str(error), 'filter') from None


def _payload(value) -> tuple[str, ...]:
    if value is True:
        return PAYLOAD_FIELDS
    if value is False:
        return ()
    if isinstance(value, list) and all(v in PAYLOAD_FIELDS for v in value):
        return tuple(value)
    raise bad_request(
        f"'return_payload' must be true, false or a list of {', '.join(PAYLOAD_FIELDS)}, got {value!r}",
        'return_payload',
    )


def similarity(scores: dict[str, float]) -> tuple[str, float]:
    """(metric, similarity) from a match's scores as the indexer gives them (AnnLite's distances)."""
    for name, value in scores.items():
        if name in ('cosine', 'inner_product'):
            return name, 1.0 - value
        if name == 'euclidean':
            return name, -value
        if name == 'maxsim':
            return name, value
    raise bad_request('the index answered without a score: is its indexer a CLIPIndexer?', None)


def search_response(hits: list[dict], payload: tuple[str, ...], model: str, prompt_tokens: int) -> dict:
    results, metric = [], None
    for hit in hits:
        metric, score = similarity(hit['scores'])
        row = {'id': hit['id'], 'score': score if math.isfinite(score) else 0.0}
        if 'rerank_score' in hit:
            row['rerank_score'] = hit['rerank_score']
        for field in payload:
            if hit.get(field):
                row[field] = hit[field]
        results.append(row)
    return {'object': 'list', 'model': model, 'metric': metric, 'results': results, 'usage': usage(prompt_tokens)}
