"""The rerank routes' and /v1/search's rerank calls to the Flow's reranker (CrossEncoderRanker), each one Jina
request addressed to that executor alone (the encoders of the Flow let it pass), through the gateway's streamer
as the /v1 routes' calls are (flow_calls.py). Shapes: rerank_api.py."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from clipserve.serving.gateway import rerank_api
from clipserve.serving.gateway.api_error import APIError
from clipserve.serving.gateway.flow_calls import FlowCalls, parameters_for
from clipserve.serving.jina.endpoints import TOKEN_COUNT_TAG
from clipserve.serving.jina.request_documents import match_scores, request_document, request_documents

RERANK_ENDPOINT = '/rerank'


async def pick_reranker(flow: FlowCalls, requested: str | None) -> tuple[str, str]:
    """(model, executor) of the reranker a request names (its name, or the last part of its path or hub id);
    the only one when it names none or a name no served reranker has but one is served."""
    await flow.models()
    served = flow.rerankers
    if not served:
        raise APIError(
            404, 'this Flow has no reranker: serve flows/rerank.yml (a CrossEncoderRanker)', None, 'no_reranker'
        )
    if requested:
        for model, executor in served.items():
            if requested in (model, PurePosixPath(model).name):
                return model, executor
        if len(served) > 1:
            names = ', '.join(sorted(served))
            raise APIError(
                404, f'no reranker {requested!r} in this Flow; it serves {names}', 'model', 'model_not_found'
            )
    model = sorted(served)[0]
    return model, served[model]


async def score(flow: FlowCalls, request: rerank_api.RerankRequest, field: str, timeout=None, top_n=None):
    """(model, [(index, relevance, raw)] best first, tokens) for the request's documents."""
    model, executor = await pick_reranker(flow, request.model)
    candidates = [request_document(f'document-{i}', text=text) for i, text in enumerate(request.documents)]
    query = request_document('query', text=request.query, matches=candidates)
    parameters = {**parameters_for(timeout), 'truncate': request.truncate, 'truncation_direction': request.direction}
    if request.max_length:
        parameters['max_length'] = request.max_length
    if top_n:
        parameters['top_n'] = top_n
    params = {'query': 'query', **{f'document-{i}': f'{field}[{i}]' for i in range(len(request.documents))}}
    target = f'^{re.escape(executor)}$'
    response = await flow.call(RERANK_ENDPOINT, request_documents([query]), parameters, params, target)
    [answer] = response.docs
    ranked = []
    for match in answer.matches:
        scores = match_scores(match)
        ranked.append(
            (int(match.id.rsplit('-', 1)[1]), scores.get('relevance_score') or 0.0, scores.get('raw_score') or 0.0)
        )
    return model, ranked, int(answer.tags.get(TOKEN_COUNT_TAG, 0) or 0)


async def rerank(flow: FlowCalls, request: rerank_api.RerankRequest, timeout: float | None = None):
    field = 'texts' if request.tei else 'documents'
    model, ranked, tokens = await score(flow, request, field, timeout, request.top_n)
    return rerank_api.rerank_response(request, ranked, model, tokens)
