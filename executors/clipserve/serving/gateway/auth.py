"""The gateway's shared token, checked on gRPC, HTTP and WebSocket before a request's body is read.

Every request must carry the token from `CLIPSERVE_AUTH_TOKEN` (the gateway's environment): gRPC as
metadata `authorization`, HTTP/WebSocket as an `Authorization` header (what clip-client and
clipserve_client send; `Bearer <token>` is accepted too). Secure by default: without a token the
gateway refuses to start, unless the operator opts out explicitly with `auth: 'off'` (YAML
`uses_with`) or `CLIPSERVE_AUTH=off`, which it then logs at every start. Only health and readiness
checks answer without the token, and they reveal nothing beyond "ready" or "not ready"; and the
playground page itself (a static file: the calls it makes carry the token the user types into it).

The check reads headers and metadata only: a refused HTTP request's body is left unread (the connection
is closed), a refused gRPC call's messages are never read (limits.refusing), so a client without the token
cannot make the gateway hold anything.
"""

from __future__ import annotations

import hmac
import json
import os

import grpc

from clipserve import environment
from clipserve.config.parameters import TOKEN_ENV
from clipserve.errors import InvalidParameterError
from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway.api_error import AUTH_ERROR
from clipserve.serving.gateway.limits import refusing
from clipserve.serving.gateway.readiness import HEALTH_PATH, LIVE_PATH, READY_PATH

AUTH_ENV = environment.AUTH.name  # the gateway's `auth` where its argument is not given: required | optional | off
AUTH_MODES = ('required', 'optional', 'off')
# Open without the token: the standard gRPC health service (SERVING / NOT_SERVING only).
OPEN_GRPC_PREFIXES = ('/grpc.health.v1.Health/',)
# Open, but the answer is cut down to its status code: `jina ping` (gRPC) and GET /dry_run (HTTP)
# would otherwise return the exception of a failed dry run, which names internal addresses.
REDACTED_GRPC_METHODS = ('/jina.JinaGatewayDryRunRPC/dry_run',)
OPEN_HTTP_PATHS = (READY_PATH, LIVE_PATH, HEALTH_PATH)  # GET only: 200/503 and a one-word body
OPEN_PAGES = (api.PLAYGROUND_PATH, api.PLAYGROUND_PATH + '/')  # GET only: a static page
REDACTED_HTTP_PATHS = ('/dry_run',)  # GET only
REFUSED = 'missing or wrong authorization token'


class AuthConfigError(InvalidParameterError):
    """The gateway was asked to check a token it does not have, or cannot check one on a protocol."""


def token_matches(presented: str | None, token: str) -> bool:
    if not presented:
        return False
    presented = presented[7:] if presented.lower().startswith('bearer ') else presented
    return hmac.compare_digest(presented.encode(), token.encode())


def auth_mode(configured: str | None, environ=os.environ) -> str:
    """The effective mode: the gateway's `auth` argument when given (an argument beats the environment, as for
    every setting), else `CLIPSERVE_AUTH`, else `required`."""
    from clipserve.config.parameters import env_or_default

    mode = str(env_or_default(configured, None) or environ.get(AUTH_ENV) or 'required').strip().lower()
    if mode not in AUTH_MODES:
        raise AuthConfigError(
            f'auth must be one of {", ".join(AUTH_MODES)} (gateway argument auth or {AUTH_ENV}), got {mode!r}'
        )
    return mode


def gateway_token(configured: str, logger, environ=os.environ) -> str | None:
    """The token the gateway checks, or None where the operator turned the check off (logged as a warning)."""
    mode = auth_mode(configured, environ)
    token = environ.get(TOKEN_ENV) or None
    if mode == 'off' or (mode == 'optional' and not token):
        logger.warning(
            f'authentication is OFF (auth={mode}, {TOKEN_ENV} '
            f'{"set but ignored" if token else "unset"}): '
            'this gateway serves anyone who can reach it'
        )
        return None
    if not token:
        raise AuthConfigError(
            f'{TOKEN_ENV} is not set, and this gateway requires a token: set {TOKEN_ENV} in the environment '
            f'of the Flow, or opt out explicitly with {AUTH_ENV}=off (the gateway then serves anyone)'
        )
    return token


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses gRPC calls without the token, whatever the method's streaming shape, from the call's metadata."""

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
        return refusing(handler, grpc.StatusCode.UNAUTHENTICATED, REFUSED)


def _status_code_only(handler):
    """A unary handler answering a StatusProto that keeps only the code of the real answer."""
    inner = handler.unary_unary

    async def answer(request, context):
        status = await inner(request, context)
        return type(status)(code=status.code)  # Jina's StatusProto

    return grpc.unary_unary_rpc_method_handler(
        answer, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


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
            if api.is_api_path(scope.get('path'))
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
