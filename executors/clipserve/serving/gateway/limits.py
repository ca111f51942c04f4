"""The gateway's limits: sizes checked before a body or a message is read, and requests in flight.

Every limit answers at once with a clear refusal that names it, before the gateway holds anything:

- `max_request_bytes` (64 MiB): one gRPC or WebSocket message, i.e. one Jina request in protobuf. gRPC
  refuses a larger message with RESOURCE_EXHAUSTED ("Received message larger than max"), uvicorn closes a
  WebSocket with 1009 (message too big) from the frame's length. 64 MiB is three images at the encoder's
  `max_image_bytes` (20 MiB), or clip-client's default batch (8) of photos up to 8 MiB each.
- `max_body_bytes` (32 MiB): one HTTP body, on every route (Jina's `/post` and `/<endpoint>`, `/v1/*`): 413,
  from the Content-Length before anything is read, or as soon as a streamed body passes it. HTTP bodies are
  JSON, which carries images as base64 (4/3 of their size) and which the gateway parses into Python objects:
  one image at `max_image_bytes` (26.7 MiB as base64) fits.
- `max_inputs` (2048, as OpenAI's embeddings API): items per `/v1` request, 400 naming it.
- `max_in_flight` (512, TEI's `--max-concurrent-requests`): requests the gateway holds at once, over every
  protocol (an HTTP request, a gRPC call, a WebSocket connection); past it HTTP 429 with `Retry-After`,
  gRPC RESOURCE_EXHAUSTED (with `retry-after` and gRPC's `grpc-retry-pushback-ms` trailers), a WebSocket
  closed with 1013 (try again later). Health and readiness checks are never counted nor refused.
- `max_stream_requests` (8): requests of one client stream (a gRPC call, a WebSocket), or HTTP requests of one
  client address, the gateway lets through at once. Jina's clients keep `prefetch` requests in flight
  (clip-client: 100), more than a replica admits (its max_requests); past this bound a stream waits in its
  flow control, an HTTP request with its body unread (PeerShare); nothing refused. A waiting request's own
  deadline (a /v1 request's X-Request-Timeout) counts from its arrival: past it, a 504 with its body unread.

A refused gRPC call is refused without reading its messages (`refusing`): gRPC 1.68 buffers a whole message
before it checks its size (grpc/grpc#43012), so reading one to refuse it would hold it all.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math

import grpc

from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway.api_error import APIError
from clipserve.serving.gateway.metrics import GatewayMetrics
from clipserve.serving.gateway.peer_share import PeerShare, TurnTimedOut
from clipserve.serving.jina.gateway_hooks import CappedPrefetch

# gRPC methods that carry requests (counted, refused past the bound); health, reflection, info are not
DATA_GRPC_PREFIXES = (
    '/jina.JinaRPC/',
    '/jina.JinaSingleDataRequestRPC/',
    '/jina.JinaSingleDocumentRequestRPC/',
    '/jina.JinaDataRequestRPC/',
)
# before refusing a gRPC call without reading it, give a client that is still writing small messages the
# time to finish: a refusal that arrives mid-write surfaces on grpc.aio clients (Jina's) as INTERNAL
REFUSE_PAUSE_SECONDS = 0.1


class InFlight:
    """The gateway's requests in flight, bounded (one event loop serves every protocol: no lock)."""

    def __init__(self, bound: int, retry_after: float, metrics: GatewayMetrics | None = None):
        self.bound = int(bound)
        self.retry_after = float(retry_after)
        self.metrics = metrics or GatewayMetrics()
        self.count = 0
        self.refused = 0
        self.metrics.watch(self)

    @property
    def full(self) -> bool:
        return self.count >= self.bound

    def enter(self, protocol: str) -> bool:
        if self.full:
            self.refuse(protocol)
            return False
        self.count += 1
        return True

    def refuse(self, protocol: str) -> None:
        self.refused += 1
        self.metrics.refused(protocol, 'max_in_flight')

    def leave(self) -> None:
        self.count -= 1

    @property
    def retry_seconds(self) -> str:
        return str(max(1, math.ceil(self.retry_after)))  # Retry-After takes whole seconds

    def message(self) -> str:
        return (
            f'overloaded: {self.count} requests in flight at this gateway, its limit (max_in_flight={self.bound}); '
            f'retry after {self.retry_seconds} s'
        )


# ---- HTTP and WebSocket (ASGI) --------------------------------------------------------------------


async def send_json(send, status: int, payload: dict, headers=()) -> None:
    body = json.dumps(payload, separators=(',', ':')).encode()
    await send(
        {
            'type': 'http.response.start',
            'status': status,
            'headers': [
                (b'content-type', b'application/json'),
                (b'content-length', str(len(body)).encode()),
                (b'cache-control', b'no-store'),
                *headers,
            ],
        }
    )
    await send({'type': 'http.response.body', 'body': body})


def _refusal(path: str | None, status: int, message: str, code: str) -> dict:
    """OpenAI's error shape on its routes, FastAPI's elsewhere (what Jina's HTTP routes answer)."""
    return APIError(status, message, None, code).body() if api.is_api_path(path) else {'detail': message}


def content_length(scope) -> int | None:
    for key, value in scope.get('headers') or ():
        if key.lower() == b'content-length':
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI, outermost: an HTTP body over `limit` is a 413, from its Content-Length before any of it is read, or
    as soon as a streamed body passes it (what the app was sent so far is its last; its answer is dropped)."""

    def __init__(self, app, limit: int, metrics: GatewayMetrics | None = None):
        self.app = app
        self.limit = int(limit)
        self.metrics = metrics or GatewayMetrics()

    def message(self) -> str:
        return (
            f"the request body is larger than the limit of {self.limit} bytes (the gateway's max_body_bytes); "
            'send fewer or smaller images per request'
        )

    async def refuse(self, scope, send) -> None:
        self.metrics.refused('http', 'max_body_bytes')
        body = _refusal(scope.get('path'), 413, self.message(), 'too_large')
        await send_json(send, 413, body, [(b'connection', b'close')])  # the rest of the body is left unread

    async def __call__(self, scope, receive, send):
        if scope['type'] != 'http':
            return await self.app(scope, receive, send)
        declared = content_length(scope)
        if declared is not None and declared > self.limit:
            return await self.refuse(scope, send)
        state = {'read': 0, 'over': False, 'started': False}

        async def counting_receive():
            if state['over']:
                return {'type': 'http.disconnect'}
            message = await receive()
            if message['type'] == 'http.request':
                state['read'] += len(message.get('body', b''))
                if state['read'] > self.limit:
                    state['over'] = True
                    raise BodyTooLarge()
            return message

        async def guarded_send(message):
            if state['over']:
                return  # this layer answers instead
            if message['type'] == 'http.response.start':
                state['started'] = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not state['over']:
                raise
        if state['over'] and not state['started']:
            await self.refuse(scope, send)


class Admission:
    """ASGI: counts HTTP requests and WebSocket connections in flight, refusing past the bound, and lets at
    most `peer_cap` HTTP requests of one client address through at once (PeerShare); `exempt(scope)` names
    what is never counted (health and readiness checks, the static page). `on_arrival(scope)` is told of each
    HTTP request as it arrives and returns the seconds it may wait for its turn (None: as long as it takes)."""

    def __init__(self, app, in_flight: InFlight, exempt, peer_cap: int | None = None, on_arrival=None):
        self.app = app
        self.in_flight = in_flight
        self.exempt = exempt
        self.peers = PeerShare(peer_cap) if peer_cap else None
        self.on_arrival = on_arrival

    async def __call__(self, scope, receive, send):
        if scope['type'] not in ('http', 'websocket') or self.exempt(scope):
            return await self.app(scope, receive, send)
        protocol = scope['type'] if scope['type'] == 'websocket' else 'http'
        if not self.in_flight.enter(protocol):
            return await self._refuse(scope, receive, send)
        try:
            wait = self.on_arrival(scope) if self.on_arrival and protocol == 'http' else None
            if self.peers is None or protocol != 'http':
                await self.app(scope, receive, send)
            else:
                async with self.peers.share(str((scope.get('client') or ('?',))[0]), wait):
                    await self.app(scope, receive, send)
        except TurnTimedOut:
            message = (
                'the request did not finish within the timeout the client gave it: it waited its whole '
                f'{wait:g} s behind other requests of its client address (the gateway lets '
                f'max_stream_requests={self.peers.cap} of one address through at once)'
            )
            await send_json(
                send, 504, _refusal(scope.get('path'), 504, message, 'timeout'), [(b'connection', b'close')]
            )
        finally:
            self.in_flight.leave()

    async def _refuse(self, scope, receive, send) -> None:
        message = self.in_flight.message()
        if scope['type'] == 'websocket':  # accepted only to say why: 1013 is "try again later"
            if (await receive())['type'] == 'websocket.connect':
                await send({'type': 'websocket.accept'})
                await send({'type': 'websocket.close', 'code': 1013, 'reason': message[:120]})
            return
        body = _refusal(scope.get('path'), 429, message, 'overloaded')
        await send_json(send, 429, body, [(b'retry-after', self.in_flight.retry_seconds.encode())])


# ---- gRPC -----------------------------------------------------------------------------------------

_MAKE_HANDLER = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def refusing(handler, code: grpc.StatusCode, message: str, trailing=()):
    """A handler that refuses a call with `code` without reading any of its messages: served as a
    client-streaming handler whatever the method, so gRPC does not read even a unary request first."""

    async def refuse(request_iterator, context):
        await asyncio.sleep(REFUSE_PAUSE_SECONDS)
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        await context.abort(code, message)

    async def refuse_streaming(request_iterator, context):
        await refuse(request_iterator, context)
        yield  # pragma: no cover (makes this an async generator, as response-streaming handlers must be)

    behaviour = refuse_streaming if handler.response_streaming else refuse
    make = _MAKE_HANDLER[(True, handler.response_streaming)]
    # request_deserializer None: nothing is parsed either
    return make(behaviour, request_deserializer=None, response_serializer=handler.response_serializer)


async def _one(request_iterator):
    async for request in request_iterator:
        return request
    raise RuntimeError('the client sent no request message')


def counted(handler, in_flight: InFlight, stream_cap: int | None = None):
    """`handler`, holding a place in `in_flight` while it runs: entered and left inside the call, so a call
    that fails before it runs holds none. A unary request is read inside too (served client-streaming).
    `stream_cap`: the most requests of one client stream the gateway holds at once (jina/gateway_hooks.py)."""
    streaming_in, streaming_out = handler.request_streaming, handler.response_streaming
    inner = {
        (False, False): handler.unary_unary,
        (False, True): handler.unary_stream,
        (True, False): handler.stream_unary,
        (True, True): handler.stream_stream,
    }[(streaming_in, streaming_out)]

    async def enter(context):
        if not in_flight.enter('grpc'):  # lost the race with another call since the interceptor looked
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, in_flight.message())
        return context if stream_cap is None else CappedPrefetch(context, stream_cap)

    async def unary_out(requests, context):
        seen = await enter(context)
        try:
            return await inner(requests if streaming_in else await _one(requests), seen)
        finally:
            in_flight.leave()

    async def streaming_out_(requests, context):
        seen = await enter(context)
        try:
            answers = inner(requests if streaming_in else await _one(requests), seen)
            if inspect.isasyncgen(answers):
                async for answer in answers:
                    yield answer
            else:
                await answers  # a handler that writes with context.write
        finally:
            in_flight.leave()

    behaviour = streaming_out_ if streaming_out else unary_out
    make = _MAKE_HANDLER[(True, streaming_out)]
    return make(
        behaviour, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Counts the gateway's data calls in flight; past the bound, RESOURCE_EXHAUSTED at once, nothing read."""

    def __init__(self, in_flight: InFlight, stream_cap: int | None = None):
        self.in_flight = in_flight
        self.stream_cap = stream_cap

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(DATA_GRPC_PREFIXES):
            return handler
        if self.in_flight.full:
            self.in_flight.refuse('grpc')
            seconds = self.in_flight.retry_seconds
            trailing = (('retry-after', seconds), ('grpc-retry-pushback-ms', str(int(seconds) * 1000)))
            return refusing(handler, grpc.StatusCode.RESOURCE_EXHAUSTED, self.in_flight.message(), trailing)
        return counted(handler, self.in_flight, self.stream_cap)
