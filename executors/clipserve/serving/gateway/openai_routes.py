"""The HTTP gateway's OpenAI-compatible routes and the playground page, as Starlette routes.

    GET  /v1/models       the Flow's models, with embedding size and modalities
    POST /v1/embeddings   OpenAI's embeddings API (texts and images), L2-normalised embeddings
    POST /v1/rank         a query against documents, scored as /rank scores them
    POST /v1/search       a query against the Flow's index (flows/search.yml): ids, scores, payloads
    POST /v1/rerank, /rerank, /v2/rerank   Cohere's, Jina's and TEI's rerank APIs, on the Flow's cross-encoder
    GET  /playground      a page to try a model (static/playground.html), calling the three routes above

Answered in front of Jina's HTTP app on the same port, behind the same TLS, size limits, token check and
admission (gateways.py); every other path goes to Jina's app. A body is read up to max_body_bytes, then parsed
(off the event loop when large; JSON values counted before they are built, at most max_inputs items). A request's
deadline comes from the client: `X-Request-Timeout: <seconds>`, else the OpenAI SDK's own per-request
timeout (`X-Stainless-Read-Timeout`), counted from the request's arrival at the gateway (`on_arrival`, which
the gateway's admission calls, bounding by it the wait for a turn of the client's address); it becomes the
request parameter `timeout_seconds` the executors drop late work by, and past it the gateway answers 504 and
cancels the request. A request whose client disconnects is cancelled too, executors included
(jina_gateway.send_request).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import re
import time
from importlib import resources

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from clipserve.serving.gateway import flow_calls as calls
from clipserve.serving.gateway import json_render, rerank_api, rerank_calls, search_api, search_calls
from clipserve.serving.gateway import openai_answers as answers
from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway.api_error import APIError, bad_request

PLAYGROUND_FILE = 'playground.html'
PLAYGROUND_PATHS = (api.PLAYGROUND_PATH, api.PLAYGROUND_PATH + '/')
TIMEOUT_HEADER = 'x-request-timeout'  # seconds, set by any client
SDK_TIMEOUT_HEADER = 'x-stainless-read-timeout'  # what the openai SDK sends: its timeout for this request
ARRIVED = 'clipserve.arrived'  # the scope's key for when the gateway took the request (time.monotonic())
NO_STORE = {'cache-control': 'no-store', 'x-content-type-options': 'nosniff'}
INLINE_BODY_BYTES = 1 << 16  # bodies parsed on the event loop; larger ones (images) on a thread


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


def playground_page() -> tuple[bytes, str] | None:
    """The page and its Content-Security-Policy (its one inline script allowed by hash, nothing external)."""
    try:
        html = (resources.files('clipserve') / 'static' / PLAYGROUND_FILE).read_bytes()
    except (FileNotFoundError, OSError):
        return None
    scripts = re.findall(rb'<script>(.*?)</script>', html, re.DOTALL)
    hashes = ' '.join(f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'" for s in scripts)
    policy = (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob: http: https:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, policy


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def client_timeout(headers) -> float | None:
    """The seconds the client gives this request: X-Request-Timeout (a bad value is a 400 naming it), else the
    openai SDK's X-Stainless-Read-Timeout (a bad value is ignored: not the caller's doing), else None."""
    for name in (TIMEOUT_HEADER, SDK_TIMEOUT_HEADER):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds > 0:
            return seconds
        if name == TIMEOUT_HEADER:
            raise bad_request(f'{TIMEOUT_HEADER} must be a number of seconds > 0, got {value!r}', None)
    return None


def on_arrival(scope) -> float | None:
    """Stamps `scope` with its arrival (a /v1 request's timeout counts from it) and returns the seconds a /v1
    request may wait for its turn: its timeout; None for other paths and for a bad header (the route's 400)."""
    scope[ARRIVED] = time.monotonic()
    if scope.get('type') != 'http' or not api.is_api_path(scope.get('path')):
        return None
    try:
        return client_timeout(Headers(scope=scope))
    except APIError:
        return None


async def off_loop_if_large(parse, raw: bytes, *args):
    """`parse(raw, *args)`: on the event loop when the body `raw` is small (a thread's hand-off costs more than
    parsing it), on a thread when it is large, so the event loop keeps serving meanwhile."""
    if len(raw) <= INLINE_BODY_BYTES:
        return parse(raw, *args)
    return await asyncio.to_thread(parse, raw, *args)


async def _disconnected(request: Request) -> None:
    while (await request.receive())['type'] != 'http.disconnect':
        pass


async def until_done(request: Request, work, deadline: float | None):
    """Await `work` (a coroutine) until it is done, the client disconnects (ClientGone) or `deadline`
    (time.monotonic()) passes (504); in the last two cases `work` is cancelled, the executors' part with it."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    done = set()
    try:
        done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            if pending not in done:
                pending.cancel()
    if task in done:
        return task.result()
    if gone in done:
        raise ClientGone()
    raise APIError(
        504, 'the request did not finish within the timeout the client gave it (X-Request-Timeout)', None, 'timeout'
    )


class OpenAIRoutes:
    """ASGI: the /v1 routes and the playground (a Starlette app); every other path goes to `app` (Jina's)."""

    def __init__(self, app, flow: calls.FlowCalls, limits, metrics: OpenAIMetrics, playground: bool, logger):
        self.app = app
        self.flow = flow
        self.max_body_bytes = int(limits.max_body_bytes)
        self.max_inputs = int(limits.max_inputs)
        self.metrics = metrics
        self.logger = logger
        self.created = int(time.time())
        self.page = playground_page() if playground else None
        if playground and self.page is None:
            logger.warning(f'the playground page ({PLAYGROUND_FILE}) is missing from the installed package')
        routes = [
            Route(api.MODELS_PATH, self.models, methods=['GET']),
            Route(api.EMBEDDINGS_PATH, self.embeddings, methods=['POST']),
            Route(api.RANK_PATH, self.rank, methods=['POST']),
            Route(search_api.SEARCH_PATH, self.search, methods=['POST']),
            *(Route(path, self.rerank, methods=['POST']) for path in rerank_api.RERANK_PATHS),
        ]
        if self.page is not None:
            routes += [Route(path, self.playground, methods=['GET']) for path in PLAYGROUND_PATHS]
        self.routes = Starlette(routes=routes, exception_handlers={404: self._no_route, 405: self._wrong_method})

    async def __call__(self, scope, receive, send):
        path = scope.get('path')
        if scope['type'] == 'http' and (api.is_api_path(path) or (self.page is not None and path in PLAYGROUND_PATHS)):
            return await self.routes(scope, receive, send)
        return await self.app(scope, receive, send)

    # ---- the routes ----------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return await self._answer(
            request,
            'models',
            lambda _: self.flow.models(),
            lambda got: answers.models_response(
                got, self.created, search=self.flow.has_index, rerankers=tuple(sorted(self.flow.rerankers))
            ),
        )

    async def embeddings(self, request: Request) -> Response:
        async def work(raw: bytes, timeout: float | None):
            parsed = await off_loop_if_large(self._parse, raw, api.parse_embeddings_request)
            self.metrics.items('embeddings', parsed.items)
            return await calls.embeddings(self.flow, parsed, timeout)

        return await self._answer(request, 'embeddings', work, body=True)

    async def rank(self, request: Request) -> Response:
        async def work(raw: bytes, timeout: float | None):
            body, parsed = await off_loop_if_large(self._parse_rank, raw)
            self.metrics.items('rank', [parsed.query, *parsed.documents])
            field = 'candidates' if 'documents' not in body and 'candidates' in body else 'documents'
            return await calls.rank(self.flow, parsed, field, timeout)

        return await self._answer(request, 'rank', work, body=True)

    async def search(self, request: Request) -> Response:
        async def work(raw: bytes, timeout: float | None):
            parsed = await off_loop_if_large(self._parse, raw, search_api.parse_search_request)
            self.metrics.items('search', [parsed.query] if parsed.query is not None else [])
            return await search_calls.search(self.flow, parsed, timeout)

        return await self._answer(request, 'search', work, body=True)

    async def rerank(self, request: Request) -> Response:
        async def work(raw: bytes, timeout: float | None):
            parsed = await off_loop_if_large(self._parse_rerank, raw)
            return await rerank_calls.rerank(self.flow, parsed, timeout)

        return await self._answer(request, 'rerank', work, body=True)

    async def playground(self, request: Request) -> Response:
        html, policy = self.page
        headers = {**NO_STORE, 'content-security-policy': policy, 'referrer-policy': 'no-referrer'}
        return Response(html, 200, headers, media_type='text/html; charset=utf-8')

    # ---- reading, parsing, answering -------------------------------------------------------------------

    def _parse(self, raw: bytes, parse):
        return parse(api.parse_body(raw, self.max_inputs), self.max_body_bytes, self.max_inputs)

    def _parse_rerank(self, raw: bytes):
        return rerank_api.parse_rerank_request(api.parse_body(raw, self.max_inputs), self.max_inputs)

    def _parse_rank(self, raw: bytes):
        body = api.parse_body(raw, self.max_inputs)
        return body, api.parse_rank_request(body, self.max_body_bytes, self.max_inputs)

    async def _read(self, request: Request, state: dict) -> bytes:
        too_large = APIError(
            413,
            f"the request body is larger than the limit of {self.max_body_bytes} bytes (the gateway's "
            'max_body_bytes); send fewer or smaller images per request',
            None,
            'too_large',
        )
        length = request.headers.get('content-length', '')
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise too_large
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise too_large
        except ClientDisconnect:
            raise ClientGone() from None
        state['read'] = True
        return bytes(body)

    async def _answer(self, request: Request, route: str, work, shape=None, body: bool = False) -> Response:
        """Run `work(raw body, timeout)` within the client's deadline; its answer (shaped by `shape`) or its
        APIError in OpenAI's shape, counted in the metrics, rendered (json_render.py)."""
        started, state = time.perf_counter(), {'read': not body}
        headers = dict(NO_STORE)
        try:
            timeout = client_timeout(request.headers)
            deadline = None if timeout is None else (request.scope.get(ARRIVED) or time.monotonic()) + timeout
            raw = await self._read(request, state) if body else b''
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            result = await until_done(request, work(raw, left) if body else work(left), deadline)
            status, payload = 200, shape(result) if shape else result
        except APIError as error:
            status, payload = error.status, error.body()
            headers.update(error.headers)
        except ClientGone:
            self.metrics.request(route, 499, time.perf_counter() - started)
            return Response(b'', 499)  # nobody reads it
        except Exception as error:  # a bug: still an answer in OpenAI's shape, and the details in the log
            self.logger.error(f'{request.url.path}: {error!r}')
            status, payload = 500, APIError(500, 'internal error in the gateway', None, 'internal_error').body()
        self.metrics.request(route, status, time.perf_counter() - started)
        if not state['read']:
            headers['connection'] = 'close'  # the body was left unread: do not keep the connection half-read
        return Response(await json_render.rendered(payload), status, headers, media_type='application/json')

    async def _no_route(self, request: Request, exc) -> Response:
        routes = ', '.join(api.ROUTES)
        error = APIError(404, f'no route {request.url.path}; the routes are {routes}', None, 'unknown_url')
        return await self._error(request, 'other', error)

    async def _wrong_method(self, request: Request, exc) -> Response:
        path = request.url.path
        if path in PLAYGROUND_PATHS:
            return Response(b'method not allowed', 405, {'allow': 'GET'}, media_type='text/plain')
        wanted = api.ROUTES.get(path, 'GET')
        error = APIError(405, f'{path} takes {wanted}, not {request.method}', None, 'method_not_allowed')
        return await self._error(request, 'other', error)

    async def _error(self, request: Request, route: str, error: APIError) -> Response:
        self.metrics.request(route, error.status, 0.0)
        headers = {**NO_STORE, 'connection': 'close'} if request.method != 'GET' else dict(NO_STORE)
        return Response(json_render.render(error.body()), error.status, headers, media_type='application/json')
