"""The `/v1` routes' calls to the Flow: models, embeddings, rank, each one Jina request (search: search_calls.py,
rerank: rerank_calls.py).

Each request becomes one Jina request, sent through the gateway's own streamer (jina/gateway_hooks.send_request)
to the same executors `/encode/<model>` and `/rank/<model>` reach, so dynamic batching, admission, the URI
policy, the size caps, per-document errors and the Prometheus metrics apply as they do to those. The
routes themselves (HTTP, bodies, deadlines) are openai_routes.py's; the shapes openai_api.py's and
openai_answers.py's.
"""

from __future__ import annotations

import asyncio
import math

from clipserve import errors
from clipserve.config.parameters import MULTI_VECTOR_PARAMETER, TOKEN_COUNTS_PARAMETER
from clipserve.models.names import canonical
from clipserve.serving.gateway import openai_answers as answers
from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway import openai_errors as v1_errors
from clipserve.serving.gateway.api_error import APIError
from clipserve.serving.jina.compat import network_error_types
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, TOKEN_COUNT_TAG
from clipserve.serving.jina.gateway_hooks import error_of, send_request
from clipserve.serving.jina.request_documents import (
    match_scores,
    request_document,
    request_documents,
)

PARAMETERS = {'drop_image_content': True, TOKEN_COUNTS_PARAMETER: True}
TIMEOUT_PARAMETER = 'timeout_seconds'  # the request parameter the executors read their deadline from


def executor_error(name: str, args, params: dict[str, str]) -> APIError:
    """An executor's exception, relayed by Jina as its class name and arguments, as an API error chosen by its
    kind (errors.py: status, code, retryable) and its structured details, never by its message's words.
    `params`: document id -> its name in the API request, for per-document failures."""
    kind = errors.kind_named(name)
    args = list(args or ())
    message = str(args[0]) if args else ''
    details = errors.details_of(args)
    if kind is errors.InvalidDocumentError and details.get('failures'):
        return v1_errors.failures_error(details['failures'], params)
    if kind is errors.ClipServeError:  # not one of clipserve's kinds: a bug, whose words stay in the logs
        return APIError(500, f'the encoder failed ({name})', None, 'internal_error')
    headers = ()
    if kind.retryable:
        seconds = details.get('retry_after')
        seconds = seconds if isinstance(seconds, (int, float)) and math.isfinite(seconds) else 1
        headers = (('retry-after', str(max(1, math.ceil(seconds)))),)
    param = 'model' if kind is errors.UnknownModelError else None
    return APIError(kind.http_status, message or kind.code, param, kind.code, headers)


class FlowCalls:
    """Requests to the Flow's executors through the gateway's streamer (its connection pool and graph)."""

    def __init__(self, streamer, logger):
        self.streamer = streamer
        self.logger = logger
        self._models: list[answers.ServedModel] | None = None
        self.has_index = False  # an indexer (CLIPIndexer) answered /clipserve/info
        self.rerankers: dict[str, str] = {}  # a reranker's model -> its executor's name (CrossEncoderRanker)
        self._lock = asyncio.Lock()

    async def call(self, endpoint: str, docs, parameters: dict, params: dict[str, str], target: str | None = None):
        """The response to one Jina request; executor errors become APIErrors (`params`: doc id -> its
        name in the API request, for per-document errors). Cancelling it cancels the executors' work.
        `target`: only the executors whose names it matches (a regular expression) take the request."""
        try:
            response = await send_request(self.streamer, docs, endpoint, parameters, target)
        except network_error_types() as error:
            code = error.code().name if error.code() else ''
            self.logger.warning(f'{endpoint}: the executors did not answer: {code} {error.details()}')
            if code == 'DEADLINE_EXCEEDED':
                raise APIError(504, 'the encoder did not answer in time', None, 'timeout') from None
            raise APIError(
                503, 'the encoder is not reachable (starting or stopping?); retry', None, 'service_unavailable'
            ) from None
        except Exception as error:
            self.logger.error(f'{endpoint}: {error!r}')
            raise APIError(500, 'internal error in the gateway', None, 'internal_error') from None
        failed = error_of(response)
        if failed is not None:
            raise executor_error(*failed, params)
        return response

    async def models(self) -> list[answers.ServedModel]:
        """The Flow's models, asked once of every executor (`/clipserve/info`) and kept."""
        async with self._lock:
            if self._models is None:
                response = await self.call(INFO_ENDPOINT, request_documents([request_document('info')]), {}, {})
                results = response.parameters.get('__results__') or {}
                found = served_models(results)
                self.has_index = any(isinstance(v, dict) and 'indexer' in v for v in results.values())
                self.rerankers = served_rerankers(results)
                if not found and not self.rerankers:
                    raise APIError(503, 'no clipserve encoder answered in this Flow', None, 'service_unavailable')
                self._models = found
            return self._models

    async def resolve(self, requested: str | None) -> answers.ServedModel:
        models = await self.models()
        model = pick_model(models, requested)
        if model is None:
            raise v1_errors.unknown_model(requested, [m.name for m in models])
        return model


def served_rerankers(results: dict) -> dict[str, str]:
    """The rerankers in `/clipserve/info` answers: model -> the executor's (deployment's) name, which Jina's
    results are keyed by (`name/rep-0`, `name/shard-0/rep-0`)."""
    found = {}
    for key, info in results.items():
        if isinstance(info, dict) and isinstance(info.get('reranker'), dict):
            found.setdefault(str(info['reranker']['model']), str(key).split('/')[0])
    return found


def served_models(results: dict) -> list[answers.ServedModel]:
    """The models in `/clipserve/info` answers ({executor: info}), one per model, the default first."""
    found: dict[str, answers.ServedModel] = {}
    for info in results.values():
        if not isinstance(info, dict) or 'model' not in info or 'embed_dim' not in info:
            continue  # not a clipserve executor
        name = str(info['model'])
        configured = str(info.get('configured_name') or name)
        aliases = tuple(sorted({configured} - {name}))
        default = bool(info.get('serve_default', True))
        if name not in found or default:
            found[name] = answers.ServedModel(
                name=name,
                embed_dim=int(info['embed_dim']),
                aliases=aliases,
                default=default,
                late_interaction=bool(info.get(MULTI_VECTOR_PARAMETER, False)),
            )
    return sorted(found.values(), key=lambda m: (not m.default, m.name))


def pick_model(models: list[answers.ServedModel], requested: str | None) -> answers.ServedModel | None:
    """The served model a request names (any of its names, or a spelling of them), or the default one."""
    if not requested:
        return next((m for m in models if m.default), models[0] if models else None)
    wanted = canonical(requested)
    for m in models:
        names = (m.name, *m.aliases)
        if requested in names or (wanted is not None and wanted in {canonical(n) for n in names}):
            return m
    return None


# ---- the documents sent to the executors --------------------------------------------------------


def item_document(item: api.Item, doc_id: str, matches=None):
    """The request document of one input (jina/request_documents.py: the installed DocArray flavour's)."""
    if item.modality == api.TEXT:
        return request_document(doc_id, text=item.text, matches=matches)
    if item.url:  # fetched by the encoder, under the operator's URI policy
        return request_document(doc_id, uri=item.url, matches=matches)
    return request_document(doc_id, blob=item.image, matches=matches)


def token_count(doc) -> int:
    return int(doc.tags.get(TOKEN_COUNT_TAG, 0) or 0) if doc.text else api.IMAGE_TOKENS


def parameters_for(timeout: float | None) -> dict:
    return PARAMETERS if timeout is None else {**PARAMETERS, TIMEOUT_PARAMETER: timeout}


async def embeddings(flow: FlowCalls, request: api.EmbeddingsRequest, timeout: float | None = None) -> dict:
    """`request` parsed (openai_api.parse_embeddings_request); `timeout`: the client's, in seconds."""
    model = await flow.resolve(request.model)
    api.check_dimensions(request.dimensions, model.name, model.embed_dim)
    api.check_multivector(request.return_multivector, model.name, model.late_interaction)
    ids = [f'input-{i}' for i in range(len(request.items))]
    docs = request_documents([item_document(item, doc_id) for item, doc_id in zip(request.items, ids)])
    params = {doc_id: f'input[{i}]' for i, doc_id in enumerate(ids)}
    parameters = parameters_for(timeout)
    if model.late_interaction:
        parameters = {**parameters, MULTI_VECTOR_PARAMETER: True}
    response = await flow.call(f'/encode/{model.name}', docs, parameters, params)
    answered = {d.id: d for d in response.docs}
    rows, tokens = [], 0
    for doc_id in ids:
        doc = answered.get(doc_id)
        if doc is None or doc.embedding is None:
            raise APIError(
                500, f'the encoder returned no embedding for {params[doc_id]}', params[doc_id], 'internal_error'
            )
        rows.append(doc.embedding)
        tokens += token_count(doc)
    if model.late_interaction:  # the model's own vectors (ColPali's are unit length each), not one per input
        return answers.multivector_response(rows, model.name, request.encoding_format, tokens)
    return answers.embeddings_response(answers.l2_normalise(rows), model.name, request.encoding_format, tokens)


async def rank(flow: FlowCalls, request: api.RankRequest, field: str, timeout: float | None = None) -> dict:
    """`field`: what the request called its documents (`documents` or `candidates`), for errors' `param`."""
    model = await flow.resolve(request.model)
    candidates = [item_document(d, f'document-{i}') for i, d in enumerate(request.documents)]
    query = item_document(request.query, 'query', matches=candidates)
    params = {'query': 'query', **{f'document-{i}': f'{field}[{i}]' for i in range(len(request.documents))}}
    response = await flow.call(f'/rank/{model.name}', request_documents([query]), parameters_for(timeout), params)
    [answer] = response.docs
    results, tokens = [], token_count(answer)
    for match in answer.matches:
        scores = {name: answers.finite(value) for name, value in match_scores(match).items()}
        results.append(answers.rank_result(int(match.id.rsplit('-', 1)[1]), scores))
        tokens += token_count(match)
    return answers.rank_response(results, model.name, tokens, request.top_n)
