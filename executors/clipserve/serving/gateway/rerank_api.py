"""The rerank APIs clients already call, as data: Cohere's and Jina's (`/v1/rerank`, `/rerank`), Cohere's v2
(`/v2/rerank`) and text-embeddings-inference's (`/rerank` with `texts`), answered from a cross-encoder's scores.

Cohere / Jina / Infinity / vLLM:
    {"model"?, "query": "...", "documents": ["...", {"text": "..."}], "top_n"?, "return_documents"?,
     "max_tokens_per_doc"? (Cohere v2), "max_length"?, "truncation_direction"?}
 -> {"id", "model", "results": [{"index", "relevance_score", "document"?: {"text"}}], "usage": {"total_tokens"},
     "meta": {...}}, best first, cut to top_n.
TEI (told apart by `texts`):
    {"query": "...", "texts": ["..."], "raw_scores"?, "return_text"?, "truncate"?, "truncation_direction"?}
 -> [{"index", "score", "text"?}], best first.

`relevance_score` (and TEI's `score`) is the sigmoid of the model's logit for that pair alone: the same pair
scores the same whatever else the request holds (TEI's `raw_scores` gives the logit). The CLIP similarity of
`/v1/rank`, a softmax over the request's documents, is another route with another meaning. No Jina here.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from clipserve.serving.gateway.api_error import bad_request
from clipserve.serving.gateway.openai_api import MAX_INPUTS, RERANK_PATHS, _model, _object

__all__ = ['RERANK_PATHS', 'RerankRequest', 'parse_rerank_request', 'rerank_response']
DIRECTIONS = {'right': 'right', 'left': 'left', 'Right': 'right', 'Left': 'left'}


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    max_length: int | None = None
    truncate: bool = True
    direction: str = 'right'
    tei: bool = False  # TEI's body: answer TEI's shape
    raw_scores: bool = False  # TEI: the logits instead of their sigmoid


def parse_rerank_request(body, max_inputs: int = MAX_INPUTS) -> RerankRequest:
    """A rerank body in any of the shapes above; an APIError (400) naming the field it cannot read."""
    body = _object(body)
    tei = 'texts' in body and 'documents' not in body
    field = 'texts' if tei else 'documents'
    query = body.get('query')
    if not isinstance(query, str) or not query.strip():
        raise bad_request(
            "'query' is required: a non-empty text", 'query', 'missing' if query is None else 'invalid_value'
        )
    items = body.get(field)
    if not isinstance(items, list) or not items:
        raise bad_request(
            f"'{field}' is required: a non-empty list of texts", field, 'missing' if items is None else 'invalid_value'
        )
    if len(items) > max_inputs:
        raise bad_request(
            f"'{field}' has {len(items)} items; at most {max_inputs} per request (the gateway's max_inputs)",
            field,
            'too_many_items',
        )
    documents = [_text(item, f'{field}[{i}]') for i, item in enumerate(items)]
    direction = body.get('truncation_direction', 'right')
    if direction not in DIRECTIONS:
        raise bad_request(f"'truncation_direction' must be right or left, got {direction!r}", 'truncation_direction')
    max_length = body.get('max_length', body.get('max_tokens_per_doc'))
    return RerankRequest(
        query=query,
        documents=documents,
        model=_model(body),
        top_n=_count(body.get('top_n'), 'top_n'),
        return_documents=_flag(body, 'return_text' if tei else 'return_documents', False),
        max_length=_count(max_length, 'max_length'),
        truncate=_flag(body, 'truncate', True),
        direction=DIRECTIONS[direction],
        tei=tei,
        raw_scores=_flag(body, 'raw_scores', False),
    )


def _text(item, param: str) -> str:
    if isinstance(item, dict):
        if 'image' in item or item.get('type') in ('image', 'image_url'):
            raise bad_request(
                f'{param}: an image; the served rerankers are text cross-encoders (rerank images by their captions, '
                'or score them with /v1/rank)',
                param,
                'unsupported_input',
            )
        item = item.get('text')
    if not isinstance(item, str) or not item.strip():
        raise bad_request(f'{param}: a document must be a non-empty text or {{"text": ...}}', param)
    return item


def _count(value, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{param}' must be an integer >= 1, got {value!r}", param)
    return value


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {value!r}", name)
    return value


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0


def rerank_response(request: RerankRequest, ranked: list[tuple[int, float, float]], model: str, tokens: int):
    """`ranked`: (index, relevance, raw) best first, already cut to top_n."""
    if request.tei:
        rows = []
        for index, relevance, raw in ranked:
            row = {'index': index, 'score': _finite(raw if request.raw_scores else relevance)}
            if request.return_documents:
                row['text'] = request.documents[index]
            rows.append(row)
        return rows
    results = []
    for index, relevance, _ in ranked:
        row = {'index': index, 'relevance_score': _finite(relevance)}
        if request.return_documents:
            row['document'] = {'text': request.documents[index]}
        results.append(row)
    return {
        'id': str(uuid.uuid4()),
        'object': 'rerank',
        'model': model,
        'results': results,
        'usage': {'prompt_tokens': tokens, 'total_tokens': tokens},
        'meta': {'api_version': {'version': '2'}, 'billed_units': {'search_units': 1}},
    }
