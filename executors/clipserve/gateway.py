"""ClipServeGateway: Jina's gateway plus an optional shared token, checked on gRPC, HTTP and WebSocket.

    gateway: {uses: ClipServeGateway, py_modules: [clipserve.gateway], protocol: [...], port: [...]}

With `CLIPSERVE_AUTH_TOKEN` set in the gateway's environment, every request must carry it:
gRPC as metadata `authorization` and HTTP/WebSocket as an `Authorization` header (what
clip-client and clipserve_client send; `Bearer <token>` is accepted too). Health and readiness
checks stay open so orchestrators and `jina ping` work. Without the variable nothing is checked.
"""

from __future__ import annotations

import hmac
import json
import os

import grpc
from jina.serve.runtimes.gateway.composite import CompositeGateway

TOKEN_ENV = 'CLIPSERVE_AUTH_TOKEN'
OPEN_GRPC_PREFIXES = ('/grpc.health.v1.Health/', '/grpc.reflection.', '/jina.JinaGatewayDryRunRPC/', '/jina.JinaInfoRPC/')
OPEN_HTTP_PATHS = ('/', '/status', '/dry_run', '/docs', '/openapi.json', '/redoc')  # GET only


def token_matches(presented: str | None, token: str) -> bool:
    if not presented:
        return False
    presented = presented[7:] if presented.lower().startswith('bearer ') else presented
    return hmac.compare_digest(presented.encode(), token.encode())


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
        return _denying(handler)


def _denying(handler):
    message = 'missing or wrong authorization token'

    async def deny_unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover (makes this an async generator, as streaming handlers must be)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    behaviour = deny_stream if handler.response_streaming else deny_unary
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class TokenMiddleware:
    """ASGI middleware for the HTTP and WebSocket gateways: 401 (HTTP) or a refused handshake (WebSocket)."""

    def __init__(self, app, token: str):
        self.app = app
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope['type'] not in ('http', 'websocket') or (
                scope['type'] == 'http' and scope.get('method') == 'GET' and scope.get('path') in OPEN_HTTP_PATHS):
            return await self.app(scope, receive, send)
        headers = {k.decode('latin-1').lower(): v.decode('latin-1') for k, v in scope.get('headers', [])}
        if token_matches(headers.get('authorization'), self.token):
            return await self.app(scope, receive, send)
        if scope['type'] == 'websocket':
            await send({'type': 'websocket.close', 'code': 1008})
            return
        body = json.dumps({'detail': 'missing or wrong Authorization header'}).encode()
        await send({'type': 'http.response.start', 'status': 401,
                    'headers': [(b'content-type', b'application/json'), (b'www-authenticate', b'Bearer')]})
        await send({'type': 'http.response.body', 'body': body})


class ClipServeGateway(CompositeGateway):
    """Jina's (composite) gateway, with the token check installed on each protocol's server."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.token = os.environ.get(TOKEN_ENV) or None
        if not self.token:
            self.logger.warning(f'{TOKEN_ENV} is not set: this gateway accepts requests without a token')
            return
        for server in self.servers:
            if hasattr(server, 'grpc_tracing_server_interceptors'):
                server.grpc_tracing_server_interceptors = [
                    *(server.grpc_tracing_server_interceptors or []), TokenInterceptor(self.token)]
            else:
                _after_setup(server, self.token)


def _after_setup(server, token: str) -> None:
    """FastAPI-based servers build their app during setup: wrap it right after, before it serves."""
    original = server.setup_server

    async def setup_server():
        await original()
        config = server.server.config  # uvicorn's
        if getattr(config, 'loaded', False):
            config.loaded_app = TokenMiddleware(config.loaded_app, token)
        else:
            config.app = TokenMiddleware(config.app, token)

    server.setup_server = setup_server
