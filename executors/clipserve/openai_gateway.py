"""The HTTP gateway's OpenAI-compatible routes and the playground page.

    GET  /v1/models       the Flow's models, with embedding size and modalities
    POST /v1/embeddings   OpenAI's embeddings API (texts and images), L2-normalised embeddings
    POST /v1/rank         a query against documents, scored as /rank scores them
    GET  /playground      a page to try a model (static/playground.html), calling the three routes above

These are ASGI routes answered in front of Jina's HTTP app (as the readiness routes are), on the same
port, behind the same TLS and the same token check (ClipServeGateway's TokenMiddleware wraps them).
They are not a second server: each request becomes one Jina request, sent through the gateway's own
streamer to the same executors `/encode/<model>` and `/rank/<model>` reach, so dynamic batching, the
URI policy, the size caps, per-document errors and the Prometheus metrics apply as they do to those.
The request and answer shapes are openai_api.py's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from importlib import resources

from docarray import Document, DocumentArray

from clipserve import openai_api as api
from clipserve.endpoints import INFO_ENDPOINT, TOKEN_COUNT_TAG
from clipserve.options import TOKEN_COUNTS_PARAMETER
from clipserve.routing import canonical

MODELS_PATH = '/v1/models'
EMBEDDINGS_PATH = '/v1/embeddings'
RANK_PATH = '/v1/rank'
PLAYGROUND_PATH = '/playground'
ROUTES = {MODELS_PATH: 'GET', EMBEDDINGS_PATH: 'POST', RANK_PATH: 'POST', PLAYGROUND_PATH: 'GET'}
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a request body over this is refused (413) before it is parsed
PLAYGROUND_FILE = 'playground.html'


def is_api_path(path: str | None) -> bool:
    return bool(path) and (path == '/v1' or path.startswith('/v1/'))


class OpenAIMetrics:
    """`clipserve_openai_requests_total` (by route and status) and `clipserve_openai_request_seconds`
    in the gateway's Prometheus registry (monitoring on); without one, no-ops."""

    def __init__(self, registry=None):
        self.enabled = registry is not None
        if not self.enabled:
            return
        from prometheus_client import Counter, Histogram

        self._requests = Counter(
            'clipserve_openai_requests',
            'Requests to the OpenAI-compatible routes',
            ('route', 'status'),
            registry=registry,
        )
        self._seconds = Histogram(
            'clipserve_openai_request_seconds',
            'Seconds to answer an OpenAI-compatible route',
            ('route',),
            registry=registry,
        )
        self._items = Counter(
            'clipserve_openai_items',
            'Texts and images sent to the OpenAI-compatible routes',
            ('route', 'modality'),
            registry=registry,
        )

    def request(self, route: str, status: int, seconds: float) -> None:
        if self.enabled:
            self._requests.labels(route, str(status)).inc()
            self._seconds.labels(route).observe(seconds)

    def items(self, route: str, items: list[api.Item]) -> None:
        if self.enabled:
            for modality in api.MODALITIES:
                count = sum(1 for item in items if item.modality == modality)
                if count:
                    self._items.labels(route, modality).inc(count)


class FlowCalls:
    """Requests to the Flow's executors through the gateway's streamer (its connection pool and graph)."""

    def __init__(self, streamer, logger):
        self.streamer = streamer
        self.logger = logger
        self._models: list[api.ServedModel] | None = None
        self._lock = asyncio.Lock()

    async def call(self, endpoint: str, docs: DocumentArray, parameters: dict, params: dict[str, str]):
        """The response to one Jina request; executor errors become APIErrors (`params`: doc id -> its
        name in the API request, for per-document errors)."""
        from jina.excepts import InternalNetworkError

        try:
            async for response, error in self.streamer.stream(
                docs=docs,
                request_size=max(1, len(docs)),
                return_results=True,
                exec_endpoint=endpoint,
                parameters=parameters,
            ):
                if error is not None:
                    raise executor_error(error.name, list(error.args), params)
                return response
        except api.APIError:
            raise
        except InternalNetworkError as error:
            code = error.code().name if error.code() else ''
            self.logger.warning(f'{endpoint}: the executors did not answer: {code} {error.details()}')
            if code == 'DEADLINE_EXCEEDED':
                raise api.APIError(504, 'the encoder did not answer in time', None, 'timeout') from None
            raise api.APIError(
                503, 'the encoder is not reachable (starting or stopping?); retry', None, 'service_unavailable'
            ) from None
        except Exception as error:
            self.logger.error(f'{endpoint}: {error!r}')
            raise api.APIError(500, 'internal error in the gateway', None, 'internal_error') from None
        raise api.APIError(500, 'the executors sent no answer', None, 'internal_error')

    async def models(self) -> list[api.ServedModel]:
        """The Flow's models, asked once of every executor (`/clipserve/info`) and kept."""
        async with self._lock:
            if self._models is None:
                response = await self.call(INFO_ENDPOINT, DocumentArray([Document()]), {}, {})
                found = served_models(response.parameters.get('__results__') or {})
                if not found:
                    raise api.APIError(503, 'no clipserve encoder answered in this Flow', None, 'service_unavailable')
                self._models = found
            return self._models

    async def resolve(self, requested: str | None) -> api.ServedModel:
        models = await self.models()
        model = pick_model(models, requested)
        if model is None:
            raise api.unknown_model(requested, [m.name for m in models])
        return model


def served_models(results: dict) -> list[api.ServedModel]:
    """The models in `/clipserve/info` answers ({executor: info}), one per model, the default first."""
    found: dict[str, api.ServedModel] = {}
    for info in results.values():
        if not isinstance(info, dict) or 'model' not in info or 'embed_dim' not in info:
            continue  # not a clipserve executor
        name = str(info['model'])
        configured = str(info.get('configured_name') or name)
        aliases = tuple(sorted({configured} - {name}))
        default = bool(info.get('serve_default', True))
        if name not in found or default:
            found[name] = api.ServedModel(name=name, embed_dim=int(info['embed_dim']), aliases=aliases, default=default)
    models = sorted(found.values(), key=lambda m: (not m.default, m.name))
    return models


def pick_model(models: list[api.ServedModel], requested: str | None) -> api.ServedModel | None:
    """The served model a request names (any of its names, or a spelling of them), or the default one."""
    if not requested:
        return next((m for m in models if m.default), models[0] if models else None)
    wanted = canonical(requested)
    for m in models:
        names = (m.name, *m.aliases)
        if requested in names or (wanted is not None and wanted in {canonical(n) for n in names}):
            return m
    return None


def executor_error(name: str, args: list[str], params: dict[str, str]) -> api.APIError:
    """An executor's exception, relayed by Jina as its class name and message, in OpenAI's shape."""
    message = args[0] if args else ''
    if name == 'InvalidDocumentError':
        return api.failures_error(api.parse_failures(message), params)
    if name == 'UnknownModelError':  # the executors' routing table: the message lists the served models
        return api.APIError(404, message or 'unknown model', 'model', 'model_not_found')
    if name == 'InvalidParameterError':
        return api.bad_request(message, None)
    return api.APIError(500, f'the encoder failed ({name})', None, 'internal_error')


# ---- the documents sent to the executors --------------------------------------------------------


def item_document(item: api.Item, doc_id: str) -> Document:
    if item.modality == api.TEXT:
        return Document(id=doc_id, text=item.text)
    if item.url:
        return Document(id=doc_id, uri=item.url)  # fetched by the encoder, under the operator's URI policy
    return Document(id=doc_id, blob=item.image)


def token_count(doc: Document) -> int:
    return int(doc.tags.get(TOKEN_COUNT_TAG, 0) or 0) if doc.text else api.IMAGE_TOKENS


PARAMETERS = {'drop_image_content': True, TOKEN_COUNTS_PARAMETER: True}


async def embeddings(flow: FlowCalls, body, max_image_bytes: int, metrics: OpenAIMetrics) -> dict:
    request = api.parse_embeddings_request(body, max_image_bytes)
    model = await flow.resolve(request.model)
    api.check_dimensions(request.dimensions, model.name, model.embed_dim)
    metrics.items('embeddings', request.items)
    ids = [f'input-{i}' for i in range(len(request.items))]
    docs = DocumentArray([item_document(item, doc_id) for item, doc_id in zip(request.items, ids)])
    params = {doc_id: f'input[{i}]' for i, doc_id in enumerate(ids)}
    response = await flow.call(f'/encode/{model.name}', docs, PARAMETERS, params)
    answered = {d.id: d for d in response.docs}
    rows, tokens = [], 0
    for doc_id in ids:
        doc = answered.get(doc_id)
        if doc is None or doc.embedding is None:
            raise api.APIError(
                500, f'the encoder returned no embedding for {params[doc_id]}', params[doc_id], 'internal_error'
            )
        rows.append(doc.embedding)
        tokens += token_count(doc)
    return api.embeddings_response(api.l2_normalise(rows), model.name, request.encoding_format, tokens)


async def rank(flow: FlowCalls, body, max_image_bytes: int, metrics: OpenAIMetrics) -> dict:
    request = api.parse_rank_request(body, max_image_bytes)
    model = await flow.resolve(request.model)
    metrics.items('rank', [request.query, *request.documents])
    field = 'candidates' if isinstance(body, dict) and 'documents' not in body and 'candidates' in body else 'documents'
    query = item_document(request.query, 'query')
    query.matches = DocumentArray([item_document(d, f'document-{i}') for i, d in enumerate(request.documents)])
    params = {'query': 'query', **{f'document-{i}': f'{field}[{i}]' for i in range(len(request.documents))}}
    response = await flow.call(f'/rank/{model.name}', DocumentArray([query]), PARAMETERS, params)
    [answer] = response.docs
    results, tokens = [], token_count(answer)
    for match in answer.matches:
        scores = match.scores
        siglip = scores['siglip_score'].value if 'siglip_score' in scores else None
        results.append(
            api.RankResult(
                index=int(match.id.rsplit('-', 1)[1]),
                clip_score=api.finite(scores['clip_score'].value),
                clip_score_cosine=api.finite(scores['clip_score_cosine'].value),
                siglip_score=None if siglip is None else api.finite(siglip),
            )
        )
        tokens += token_count(match)
    return api.rank_response(results, model.name, tokens, request.top_n)


# ---- the ASGI routes ----------------------------------------------------------------------------


def playground_page() -> tuple[bytes, str] | None:
    """The page and its Content-Security-Policy (its one inline script allowed by hash, nothing external)."""
    try:
        html = (resources.files('clipserve') / 'static' / PLAYGROUND_FILE).read_bytes()
    except (FileNotFoundError, OSError):
        return None
    scripts = re.findall(rb'<script>(.*?)</script>', html, re.DOTALL)
    hashes = ' '.join(f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'" for s in scripts)
    policy = (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, policy


class BodyTooLarge(Exception):
    pass


async def read_body(scope, receive, limit: int) -> bytes:
    headers = dict(scope.get('headers') or [])
    length = headers.get(b'content-length', b'').strip()
    if length.isdigit() and int(length) > limit:
        raise BodyTooLarge()
    chunks, size = [], 0
    while True:
        message = await receive()
        if message['type'] == 'http.disconnect':
            raise ConnectionError('the client went away')
        chunk = message.get('body', b'')
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
        if not message.get('more_body'):
            return b''.join(chunks)


async def send_answer(send, status: int, body: bytes, content_type: bytes, extra_headers=()) -> None:
    await send(
        {
            'type': 'http.response.start',
            'status': status,
            'headers': [
                (b'content-type', content_type),
                (b'content-length', str(len(body)).encode()),
                (b'cache-control', b'no-store'),
                (b'x-content-type-options', b'nosniff'),
                *extra_headers,
            ],
        }
    )
    await send({'type': 'http.response.body', 'body': body})


async def send_json(send, status: int, payload: dict, close: bool = False) -> None:
    """`close`: the request's body was left unread, so the connection is closed rather than kept half-read."""
    extra = [(b'connection', b'close')] if close else []
    await send_answer(send, status, json.dumps(payload, separators=(',', ':')).encode(), b'application/json', extra)


class OpenAIRoutes:
    """ASGI middleware answering the routes above; every other path goes to Jina's app."""

    def __init__(self, app, flow: FlowCalls, max_request_bytes: int, metrics: OpenAIMetrics, playground: bool, logger):
        self.app = app
        self.flow = flow
        self.max_request_bytes = int(max_request_bytes)
        self.metrics = metrics
        self.page = playground_page() if playground else None
        if playground and self.page is None:
            logger.warning(f'the playground page ({PLAYGROUND_FILE}) is missing from the installed package')
        self.logger = logger
        self.created = int(time.time())

    async def __call__(self, scope, receive, send):
        path = scope.get('path')
        if scope['type'] != 'http' or (path not in ROUTES and path != PLAYGROUND_PATH + '/' and not is_api_path(path)):
            return await self.app(scope, receive, send)
        method = scope.get('method')
        if path in (PLAYGROUND_PATH, PLAYGROUND_PATH + '/'):
            if self.page is None:
                return await self.app(scope, receive, send)
            if method not in ('GET', 'HEAD'):
                return await send_answer(send, 405, b'method not allowed', b'text/plain', [(b'allow', b'GET')])
            html, policy = self.page
            return await send_answer(
                send,
                200,
                html if method == 'GET' else b'',
                b'text/html; charset=utf-8',
                [(b'content-security-policy', policy.encode()), (b'referrer-policy', b'no-referrer')],
            )
        started = time.perf_counter()
        route = path.rsplit('/', 1)[-1] if path in ROUTES else 'other'  # a bounded set of metric labels
        body_read = {'body': method == 'GET'}

        async def receive_all():
            message = await receive()
            body_read['body'] = not message.get('more_body') and message['type'] == 'http.request'
            return message

        try:
            if path not in ROUTES:
                raise api.APIError(
                    404,
                    f'no route {path}; the routes are {", ".join(r for r in ROUTES if is_api_path(r))}',
                    None,
                    'unknown_url',
                )
            if method != ROUTES[path]:
                raise api.APIError(405, f'{path} takes {ROUTES[path]}, not {method}', None, 'method_not_allowed')
            status, answer = 200, await self._answer(path, scope, receive_all)
        except api.APIError as error:
            status, answer = error.status, error.body()
        except ConnectionError:
            return
        except Exception as error:  # a bug: still an answer in OpenAI's shape, and the details in the log
            self.logger.error(f'{path}: {error!r}')
            status, answer = 500, api.APIError(500, 'internal error in the gateway', None, 'internal_error').body()
        self.metrics.request(route, status, time.perf_counter() - started)
        await send_json(send, status, answer, close=not body_read['body'])

    async def _answer(self, path: str, scope, receive) -> dict:
        if path == MODELS_PATH:
            return api.models_response(await self.flow.models(), self.created)
        try:
            raw = await read_body(scope, receive, self.max_request_bytes)
        except BodyTooLarge:
            raise api.APIError(
                413,
                f"the request body is larger than the limit of {self.max_request_bytes} bytes (the gateway's "
                'max_request_bytes); send fewer or smaller images per request',
                None,
                'too_large',
            ) from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise api.bad_request(f'the request body is not valid JSON: {e}', None, 'invalid_json') from None
        except RecursionError:
            raise api.bad_request('the request body is nested too deeply', None, 'invalid_json') from None
        handler = embeddings if path == EMBEDDINGS_PATH else rank
        return await handler(self.flow, body, self.max_request_bytes, self.metrics)
