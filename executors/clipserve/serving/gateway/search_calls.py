"""POST /v1/search's calls to the Flow: the query to its encoder and indexer (flows/search.yml), then, when the
request asks (`rerank`), its candidates' captions to the Flow's reranker (flows/search-rerank.yml): retrieve,
then rerank, in one call. Shapes: search_api.py."""

from __future__ import annotations

import numpy as np

from clipserve.serving.gateway import rerank_api, rerank_calls, search_api
from clipserve.serving.gateway.api_error import APIError, bad_request
from clipserve.serving.gateway.flow_calls import FlowCalls, parameters_for, token_count
from clipserve.serving.jina.request_documents import request_documents, search_hits, search_query


async def search(flow: FlowCalls, request: search_api.SearchRequest, timeout: float | None = None) -> dict:
    """The query encoded by the Flow's default model (a vector goes as it is), searched by its indexer, then
    reranked when asked."""
    model = await flow.resolve(request.model)
    if not model.default:
        default = (await flow.resolve(None)).name
        raise bad_request(
            f'/v1/search embeds the query with the model the index was built with ({default}); {model.name} is '
            "another of the Flow's models",
            'model',
        )
    if not flow.has_index:
        raise APIError(
            404, 'this Flow has no index: serve flows/search.yml (a CLIPIndexer after the encoder)', None, 'no_index'
        )
    item = request.query
    if request.rerank is not None and (item is None or not item.text):
        raise bad_request('rerank needs a text query: the rerankers are text cross-encoders', 'rerank')
    if item is None:
        query = search_query('query', embedding=np.asarray(request.vector, dtype=np.float32))
    else:
        query = search_query('query', text=item.text or None, uri=item.url or None, blob=item.image or None)
    parameters = {**parameters_for(timeout), 'limit': request.top_k, 'include_metadata': True}
    if request.filter:
        parameters['filter'] = request.filter
    if request.ef_search:
        parameters['ef_search'] = request.ef_search
    response = await flow.call('/search', request_documents([query]), parameters, {'query': 'query'})
    [answer] = response.docs
    hits = search_hits(answer)
    tokens = token_count(answer) if item is not None else 0
    if request.rerank is not None:
        hits, used = await reranked(flow, item.text, hits, request.rerank, timeout)
        tokens += used
    return search_api.search_response(hits, request.payload, model.name, tokens)


async def reranked(flow: FlowCalls, text: str, hits: list[dict], asked: search_api.Rerank, timeout) -> tuple[list, int]:
    """The hits with captions reranked by the cross-encoder (each with its `rerank_score`), best first, cut to
    `top_n`; hits without a caption follow, in search order (a text cross-encoder cannot score them)."""
    captioned = [h for h in hits if h.get('text')]
    others = [h for h in hits if not h.get('text')]
    if not captioned:
        return hits[: asked.top_n], 0
    request = rerank_api.RerankRequest(query=text, documents=[h['text'] for h in captioned], model=asked.model)
    _, ranked, tokens = await rerank_calls.score(flow, request, 'results', timeout)
    ordered = [{**captioned[index], 'rerank_score': relevance} for index, relevance, _ in ranked]
    return (ordered + others)[: asked.top_n], tokens
