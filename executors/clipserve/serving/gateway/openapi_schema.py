"""The HTTP routes clipserve answers in front of Jina's app (the `/v1` API, the rerank APIs, the service routes),
described in OpenAPI 3 so that `/openapi.json` and the `/docs` page list them with their request and answer
schemas next to Jina's own routes. The shapes are the parsers' (openai_api.py, search_api.py, rerank_api.py)
and the answers' (openai_answers.py); tests/integration/test_http_surface.py validates real requests and
answers against these schemas, so they cannot drift unseen.
"""

from __future__ import annotations

from clipserve.serving.gateway.openai_api import EMBEDDINGS_PATH, MODELS_PATH, PLAYGROUND_PATH, RANK_PATH, SEARCH_PATH
from clipserve.serving.gateway.openapi_components import SCHEMAS, ref
from clipserve.serving.gateway.rerank_api import RERANK_PATHS

TAG_API, TAG_RERANK, TAG_SERVICE = 'clipserve: embeddings, rank, search', 'clipserve: rerank', 'clipserve: service'


_ERRORS = {
    '400': 'a bad request: the message names the field or the input and what it accepts',
    '401': 'a missing or wrong token (a gateway with one)',
    '404': 'an unknown model (the message lists the served ones), or a route the Flow does not have',
    '413': "a body over the gateway's max_body_bytes",
    '429': 'the gateway or the replicas are full: retry after Retry-After seconds',
    '503': 'the Flow is not ready, or an executor is down',
    '504': 'the request did not finish within X-Request-Timeout',
}


def _json(schema: dict, description: str) -> dict:
    return {'description': description, 'content': {'application/json': {'schema': schema}}}


def _post(summary: str, tag: str, request: str, answer: str, description: str = '') -> dict:
    responses = {'200': _json(ref(answer), 'the answer')}
    responses.update({code: _json(ref('Error'), text) for code, text in _ERRORS.items()})
    return {
        'post': {
            'summary': summary,
            'description': description,
            'tags': [tag],
            'requestBody': {'required': True, 'content': {'application/json': {'schema': ref(request)}}},
            'responses': responses,
        }
    }


def _get(summary: str, tag: str, answer: dict, description: str = '', errors=('401',)) -> dict:
    responses = {'200': answer}
    responses.update({code: _json(ref('Error'), _ERRORS[code]) for code in errors})
    return {'get': {'summary': summary, 'description': description, 'tags': [tag], 'responses': responses}}


def paths(playground: bool = True, v1: bool = True) -> dict:
    """The OpenAPI paths of clipserve's routes on this gateway (those it serves: `openai_routes`, `playground`)."""
    found = {
        '/': _get('What this server is: name, version, models, links', TAG_SERVICE, _json(ref('Index'), 'the index')),
        '/readyz': _get(
            'Ready: every executor copy answers (200), else 503',
            TAG_SERVICE,
            _json(ref('Status'), 'ready'),
            errors=('503',),
        ),
        '/health': _get(
            'The same as /readyz (the name TEI and Infinity use)',
            TAG_SERVICE,
            _json(ref('Status'), 'ready'),
            errors=('503',),
        ),
        '/livez': _get('Alive: the gateway answers', TAG_SERVICE, _json(ref('Status'), 'live'), errors=()),
        '/metrics': _get(
            "The gateway's Prometheus metrics (a Flow with monitoring on)",
            TAG_SERVICE,
            {'description': 'Prometheus text format', 'content': {'text/plain': {'schema': {'type': 'string'}}}},
            errors=('401', '404'),
        ),
    }
    if v1:
        found.update(_v1_paths())
    if playground:
        found[PLAYGROUND_PATH] = _get(
            'A page to try the model and search the index in a browser',
            TAG_SERVICE,
            {'description': 'the page', 'content': {'text/html': {'schema': {'type': 'string'}}}},
            errors=(),
        )
    return found


def _v1_paths() -> dict:
    """The `/v1` API's paths and the rerank APIs'."""
    found = {}
    found[MODELS_PATH] = _get(
        "The Flow's models (OpenAI's list) and what else it answers",
        TAG_API,
        _json(ref('ModelList'), 'the models'),
        errors=('401', '503'),
    )
    found[EMBEDDINGS_PATH] = _post(
        "Embeddings of texts and images (OpenAI's embeddings API)",
        TAG_API,
        'EmbeddingsRequest',
        'EmbeddingsResponse',
    )
    found[RANK_PATH] = _post(
        'A query against documents, scored as /rank scores them (CLIP similarity)',
        TAG_API,
        'RankRequest',
        'RankResponse',
    )
    found[SEARCH_PATH] = _post(
        "A text, an image or a vector against the Flow's index; optionally reranked",
        TAG_API,
        'SearchRequest',
        'SearchResponse',
    )
    for path in RERANK_PATHS:
        found[path] = _post(
            f"Rerank texts with the Flow's cross-encoder ({'Cohere v2' if path == '/v2/rerank' else 'Cohere, Jina, TEI'})",
            TAG_RERANK,
            'RerankRequest',
            'RerankResponse',
        )
    return found


def extend(schema: dict, playground: bool = True, v1: bool = True) -> dict:
    """Jina's OpenAPI document with clipserve's routes and schemas added (clipserve's first)."""
    schema = dict(schema)
    schema['info'] = {**schema.get('info', {}), 'title': 'clipserve'}
    ours = paths(playground, v1)  # answered before Jina's app sees the request: ours win (GET / too)
    schema['paths'] = {**ours, **{k: v for k, v in schema.get('paths', {}).items() if k not in ours}}
    components = dict(schema.get('components', {}))
    components['schemas'] = {**components.get('schemas', {}), **SCHEMAS}
    schema['components'] = components
    return schema
