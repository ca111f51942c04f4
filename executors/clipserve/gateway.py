"""The gateways of clipserve's Flows: Jina's gateway plus a readiness signal, and optionally a token.

    gateway: {uses: ReadyGateway, py_modules: [clipserve.gateway], protocol: [...], port: [...]}
    gateway: {uses: ClipServeGateway, py_modules: [clipserve.gateway], protocol: [...], port: [...]}

ReadyGateway answers "is every copy of every executor up?" on each protocol (see `readiness.py`):
gRPC health service `readiness`, HTTP/WebSocket port `GET /readyz` (200 or 503) and `GET /livez`.

Both serve, on their HTTP port, the OpenAI-compatible routes `/v1/models`, `/v1/embeddings`, `/v1/rank`
and the playground page `/playground` (see `openai_gateway.py`).

ClipServeGateway adds a shared token, checked on gRPC, HTTP and WebSocket.

Every request must carry the token from `CLIPSERVE_AUTH_TOKEN` (the gateway's environment): gRPC as
metadata `authorization`, HTTP/WebSocket as an `Authorization` header (what clip-client and
clipserve_client send; `Bearer <token>` is accepted too). Secure by default: without a token the
gateway refuses to start, unless the operator opts out explicitly with `auth: 'off'` (YAML
`uses_with`) or `CLIPSERVE_AUTH=off`, which it then logs at every start. Only health and readiness
checks answer without the token, and they reveal nothing beyond "ready" or "not ready"; and the
playground page itself (a static file: the calls it makes carry the token the user types into it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os

import grpc
from grpc_health.v1 import health_pb2
from jina.proto import jina_pb2
from jina.serve.runtimes.gateway.composite import CompositeGateway
from jina.serve.runtimes.servers.grpc import GRPCServer
from jina.serve.runtimes.servers.http import FastAPIBaseServer, HTTPServer
from jina.serve.runtimes.servers.websocket import WebSocketServer

from clipserve import openai_gateway
from clipserve.errors import InvalidParameterError
from clipserve.openai_api import AUTH_ERROR
from clipserve.options import check_bool, check_int, env_or_default
from clipserve.readiness import LIVE_PATH, READINESS_SERVICE, READY_PATH, FlowReadiness, grpc_addresses

TOKEN_ENV = 'CLIPSERVE_AUTH_TOKEN'
AUTH_ENV = 'CLIPSERVE_AUTH'  # overrides the gateway's `auth` argument: required | optional | off
AUTH_MODES = ('required', 'optional', 'off')
# Open without the token: the standard gRPC health service (SERVING / NOT_SERVING only).
OPEN_GRPC_PREFIXES = ('/grpc.health.v1.Health/',)
# Open, but the answer is cut down to its status code: `jina ping` (gRPC) and GET /dry_run (HTTP)
# would otherwise return the exception of a failed dry run, which names internal addresses.
REDACTED_GRPC_METHODS = ('/jina.JinaGatewayDryRunRPC/dry_run',)
OPEN_HTTP_PATHS = (READY_PATH, LIVE_PATH)  # GET only: 200/503 and a one-word body
OPEN_PAGES = (openai_gateway.PLAYGROUND_PATH, openai_gateway.PLAYGROUND_PATH + '/')  # GET only: a static page
REDACTED_HTTP_PATHS = ('/dry_run',)  # GET only


class AuthConfigError(InvalidParameterError):
    """The gateway was asked to check a token it does not have, or cannot check one on a protocol."""


def token_matches(presented: str | None, token: str) -> bool:
    if not presented:
        return False
    presented = presented[7:] if presented.lower().startswith('bearer ') else presented
    return hmac.compare_digest(presented.encode(), token.encode())


def auth_mode(configured: str, environ=os.environ) -> str:
    """The effective mode: `CLIPSERVE_AUTH` when set, else the gateway's `auth` argument."""
    mode = str(environ.get(AUTH_ENV) or configured).strip().lower()
    if mode not in AUTH_MODES:
        raise AuthConfigError(
            f'auth must be one of {", ".join(AUTH_MODES)} (gateway argument auth or {AUTH_ENV}), got {mode!r}'
        )
    return mode


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses gRPC calls without the token, whatever the method's streaming shape."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = dict(details.invocation_metadata or ())
        if token_matches(metadata.get('authorization'), self.token):
            return handler
        if details.method in REDACTED_GRPC_METHODS:
            return _status_code_only(handler)
        return _denying(handler)


def _status_code_only(handler):
    """A unary handler answering a StatusProto that keeps only the code of the real answer."""
    inner = handler.unary_unary

    async def answer(request, context):
        status = await inner(request, context)
        return jina_pb2.StatusProto(code=status.code)

    return grpc.unary_unary_rpc_method_handler(
        answer, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


# Before refusing a client-streaming call, read (without parsing) what the client is sending, up to
# these bounds: a refusal that arrives while the client is still writing surfaces on its side as a failed
# write (gRPC INTERNAL) instead of UNAUTHENTICATED.
DENY_DRAIN_MESSAGES = 64
DENY_DRAIN_SECONDS = 2.0


async def _drain(request_iterator) -> None:
    async def read():
        count = 0
        async for _ in request_iterator:
            count += 1
            if count >= DENY_DRAIN_MESSAGES:
                return

    try:
        await asyncio.wait_for(read(), DENY_DRAIN_SECONDS)
    except Exception:  # a timeout or a broken stream: refuse all the same
        pass


def _denying(handler):
    message = 'missing or wrong authorization token'
    streaming_in = handler.request_streaming

    async def deny_unary(request, context):
        if streaming_in:
            await _drain(request)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request, context):
        if streaming_in:
            await _drain(request)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover (makes this an async generator, as streaming handlers must be)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    behaviour = deny_stream if handler.response_streaming else deny_unary
    # request_deserializer None: the refused messages stay bytes, never parsed
    return make(behaviour, request_deserializer=None, response_serializer=handler.response_serializer)


class TokenMiddleware:
    """ASGI middleware for the HTTP and WebSocket gateways: 401 (HTTP) or a refused handshake (WebSocket)."""

    def __init__(self, app, token: str):
        self.app = app
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope['type'] not in ('http', 'websocket'):  # lifespan events
            return await self.app(scope, receive, send)
        get = scope['type'] == 'http' and scope.get('method') in ('GET', 'HEAD')
        if get and scope.get('path') in OPEN_HTTP_PATHS + OPEN_PAGES:
            return await self.app(scope, receive, send)
        headers = {k.decode('latin-1').lower(): v.decode('latin-1') for k, v in scope.get('headers', [])}
        if token_matches(headers.get('authorization'), self.token):
            return await self.app(scope, receive, send)
        if get and scope.get('path') in REDACTED_HTTP_PATHS:
            return await self.app(scope, receive, _code_only(send))
        if scope['type'] == 'websocket':
            await send({'type': 'websocket.close', 'code': 1008})
            return
        body = json.dumps(
            AUTH_ERROR.body()  # OpenAI's error shape on its routes
            if openai_gateway.is_api_path(scope.get('path'))
            else {'detail': 'missing or wrong Authorization header'}
        ).encode()
        await send(
            {
                'type': 'http.response.start',
                'status': 401,
                # the request's body is left unread: close the connection rather than keep it half-read
                'headers': [
                    (b'content-type', b'application/json'),
                    (b'www-authenticate', b'Bearer'),
                    (b'connection', b'close'),
                ],
            }
        )
        await send({'type': 'http.response.body', 'body': body})


def _code_only(send):
    """An ASGI `send` that replaces a JSON body by {"code": <its code>}, the rest of the answer dropped."""
    start, chunks = {}, []

    async def filtered(message):
        if message['type'] == 'http.response.start':
            start.update(message)
            return
        if message['type'] != 'http.response.body':
            return await send(message)
        chunks.append(message.get('body', b''))
        if message.get('more_body'):
            return
        try:
            code = json.loads(b''.join(chunks)).get('code')
        except (ValueError, AttributeError):
            code = None
        body = json.dumps({'code': code}).encode()
        headers = [(k, v) for k, v in start.get('headers', []) if k.lower() not in (b'content-length', b'content-type')]
        await send(
            {
                **start,
                'headers': [
                    *headers,
                    (b'content-type', b'application/json'),
                    (b'content-length', str(len(body)).encode()),
                ],
            }
        )
        await send({'type': 'http.response.body', 'body': body})

    return filtered


class ReadinessMiddleware:
    """ASGI: answers GET /readyz (200 ready, 503 not) and GET /livez (200) before Jina's app sees them."""

    def __init__(self, app, readiness: FlowReadiness):
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope, receive, send):
        path = scope.get('path')
        if scope['type'] != 'http' or scope.get('method') not in ('GET', 'HEAD') or path not in (READY_PATH, LIVE_PATH):
            return await self.app(scope, receive, send)
        ok = path == LIVE_PATH or self.readiness.ready
        word = ('live' if path == LIVE_PATH else 'ready') if ok else 'not ready'
        body = json.dumps({'status': word}).encode()
        await send(
            {
                'type': 'http.response.start',
                'status': 200 if ok else 503,
                'headers': [
                    (b'content-type', b'application/json'),
                    (b'content-length', str(len(body)).encode()),
                    (b'cache-control', b'no-store'),
                ],
            }
        )
        await send({'type': 'http.response.body', 'body': body if scope.get('method') == 'GET' else b''})


def expose_readiness(server, readiness: FlowReadiness) -> None:
    """Show the Flow's readiness on one of Jina's servers: a gRPC health service or two HTTP paths."""
    if isinstance(server, GRPCServer):
        health = server.health_servicer

        async def on_change(ready: bool):
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            await health.set(READINESS_SERVICE, status)

        readiness.listeners.append(on_change)
        original = server.setup_server

        async def setup_server():
            await original()
            await on_change(readiness.ready)

        server.setup_server = setup_server
    elif isinstance(server, (FastAPIBaseServer, WebSocketServer)):
        _wrap_app_after_setup(server, lambda app: ReadinessMiddleware(app, readiness))
    else:
        raise AuthConfigError(
            f'cannot serve readiness on a {type(server).__name__} server; use the grpc, http or websocket protocol'
        )


class ReadyGateway(CompositeGateway):
    """Jina's (composite) gateway plus the Flow's readiness on each protocol, probed every `readiness_interval` s,
    and on the HTTP port the OpenAI-compatible routes and the playground (`openai_routes`, `playground`; a
    request body over `max_request_bytes` is refused there with 413)."""

    def __init__(
        self,
        readiness_interval: float = 1.0,
        openai_routes: bool = True,
        playground: bool = True,
        max_request_bytes: int = openai_gateway.DEFAULT_MAX_REQUEST_BYTES,
        **kwargs,
    ):
        super().__init__(**kwargs)
        deployments = grpc_addresses(getattr(self.runtime_args, 'deployments_addresses', None) or '{}')
        self.readiness = FlowReadiness(deployments, interval=float(readiness_interval), log=self.logger)
        self._readiness_task = None
        for server in self.servers:
            expose_readiness(server, self.readiness)
        max_request_bytes = check_int(
            'max_request_bytes', env_or_default(max_request_bytes, openai_gateway.DEFAULT_MAX_REQUEST_BYTES)
        )
        playground = check_bool('playground', env_or_default(playground, True))
        if check_bool('openai_routes', env_or_default(openai_routes, True)):
            flow = openai_gateway.FlowCalls(self.streamer, self.logger)
            metrics = openai_gateway.OpenAIMetrics(getattr(self, 'metrics_registry', None))
            for server in self.servers:
                if isinstance(server, HTTPServer):
                    _wrap_app_after_setup(
                        server,
                        lambda app: openai_gateway.OpenAIRoutes(
                            app, flow, max_request_bytes, metrics, playground, self.logger
                        ),
                    )

    @property
    def _should_exit(self) -> bool:
        # Jina's composite server counts a server without `should_exit` (gRPC's) as exited, so a
        # gRPC-only composite gateway would stop right after it starts. Here: exit when every server
        # that can tell (HTTP, WebSocket) has exited; a gRPC server runs until the gateway is cancelled.
        told = [server.should_exit for server in self.servers if hasattr(server, 'should_exit')]
        return bool(told) and all(told)

    async def setup_server(self):
        await super().setup_server()
        self._readiness_task = asyncio.create_task(self.readiness.run())

    async def shutdown(self):
        await self.readiness.close()
        if self._readiness_task is not None:
            self._readiness_task.cancel()
        await super().shutdown()


class ClipServeGateway(ReadyGateway):
    """ReadyGateway with the token check installed on each protocol's server.

    `auth`: `required` (the default: no token, no start), `optional` (checked when the token is set)
    or `off`; `CLIPSERVE_AUTH` in the environment overrides it.
    """

    def __init__(self, auth: str = 'required', **kwargs):
        super().__init__(**kwargs)
        mode = auth_mode(auth)
        self.token = os.environ.get(TOKEN_ENV) or None
        if mode == 'off' or (mode == 'optional' and not self.token):
            self.logger.warning(
                f'authentication is OFF (auth={mode}, {TOKEN_ENV} '
                f'{"set but ignored" if self.token else "unset"}): '
                'this gateway serves anyone who can reach it'
            )
            self.token = None
            return
        if not self.token:
            raise AuthConfigError(
                f'{TOKEN_ENV} is not set, and this gateway requires a token: set {TOKEN_ENV} in the environment '
                f'of the Flow, or opt out explicitly with {AUTH_ENV}=off (the gateway then serves anyone)'
            )
        for server in self.servers:
            protect(server, self.token)
        self.logger.info(f'token authentication on for {len(self.servers)} protocol(s)')


def protect(server, token: str) -> None:
    """Install the token check on one of Jina's servers, chosen by its type; unknown types refuse to start."""
    if isinstance(server, GRPCServer):
        # GRPCServer builds its grpc.aio server with this list of interceptors (in setup_server).
        if not hasattr(server, 'grpc_tracing_server_interceptors'):
            raise AuthConfigError(
                f'cannot install the token check on {type(server).__name__}: this jina '
                'version builds its gRPC server differently'
            )
        server.grpc_tracing_server_interceptors = [
            *(server.grpc_tracing_server_interceptors or []),
            TokenInterceptor(token),
        ]
    elif isinstance(server, (FastAPIBaseServer, WebSocketServer)):
        _wrap_app_after_setup(server, lambda app: TokenMiddleware(app, token))
    else:
        raise AuthConfigError(
            f'cannot install the token check on a {type(server).__name__} server; '
            'use the grpc, http or websocket protocol'
        )


def _wrap_app_after_setup(server, wrap) -> None:
    """FastAPI-based servers build their app during setup: wrap it right after, before it serves."""
    original = server.setup_server

    async def setup_server():
        await original()
        config = server.server.config  # uvicorn's
        if getattr(config, 'loaded', False):
            config.loaded_app = wrap(config.loaded_app)
        else:
            config.app = wrap(config.app)

    server.setup_server = setup_server
