"""A stand-in Jina gateway (gRPC, HTTP and WebSocket) that records what reaches it.

Real Flows ignore credentials and answer quickly; this one shows the headers and metadata the client
sent, can answer slowly, can fail its first requests the way a gateway that is warming up does
(UNAVAILABLE, HTTP 503, a dropped WebSocket), can refuse its first requests the way a full replica does
(clipserve's OverloadedError in the answer's header; over HTTP with 429 and Retry-After, as clipserve's
gateway answers it), and can be started late (a server that is not up yet).
Every document gets the embedding [len(text), 0, 0, 0].
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import numpy as np
from aiohttp import WSMsgType, web
from jina.proto import jina_pb2, jina_pb2_grpc
from jina.types.request.data import DataRequest

LIMIT = 'overloaded: 1 requests in flight on this replica, its limit (max_requests=1); retry after 0.3s'


def _overloaded(request: DataRequest) -> DataRequest:
    """A replica's refusal as Jina relays an executor's exception: the class name and its arguments."""
    request.header.status.code = jina_pb2.StatusProto.ERROR
    request.header.status.description = f'OverloadedError({LIMIT!r})'
    request.header.status.exception.name = 'OverloadedError'
    request.header.status.exception.args.extend([LIMIT, json.dumps({'limit': 'max_requests', 'retry_after': 0.3})])
    request.header.status.exception.executor = 'CLIPEncoder'
    return request


def _answer(request: DataRequest) -> DataRequest:
    docs = request.docs
    for doc in docs:
        doc.embedding = np.array([len(doc.text or ''), 0, 0, 0], dtype=np.float32)
    request.data.docs = docs  # written back into the message, as jina's workers do
    return request


class FakeGateway:
    def __init__(self, protocol: str, port: int, delay: float = 0.0, fail_first: int = 0, overload_first: int = 0):
        self.protocol, self.port, self.delay = protocol, port, delay
        self.failures_left = fail_first
        self.overloads_left = overload_first
        self.arrivals: list[float] = []
        self.authorizations: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stop = None

    def start(self) -> 'FakeGateway':
        self._thread.start()
        start = self._start_grpc if self.protocol == 'grpc' else self._start_web
        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def _respond(self, request: DataRequest) -> DataRequest:
        self.arrivals.append(time.monotonic())
        if self.overloads_left > 0:
            self.overloads_left -= 1
            return _overloaded(request)
        return _answer(request)

    def _fail(self) -> bool:
        if self.failures_left > 0:
            self.failures_left -= 1
            return True
        return False

    async def _start_grpc(self):
        gateway = self

        class Servicer(jina_pb2_grpc.JinaSingleDataRequestRPCServicer):
            async def process_single_data(self, request, context):
                gateway.authorizations.append(dict(context.invocation_metadata()).get('authorization'))
                if gateway._fail():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, 'warming up')
                await asyncio.sleep(gateway.delay)
                return gateway._respond(request)

        server = grpc.aio.server()
        jina_pb2_grpc.add_JinaSingleDataRequestRPCServicer_to_server(Servicer(), server)
        server.add_insecure_port(f'127.0.0.1:{self.port}')
        await server.start()
        self._stop = lambda: server.stop(0)

    async def _start_web(self):
        async def post(request: web.Request):
            self.authorizations.append(request.headers.get('Authorization'))
            if self._fail():
                return web.json_response({'detail': 'warming up'}, status=503)
            await asyncio.sleep(self.delay)
            body = await request.json()
            query = DataRequest()
            query.header.exec_endpoint = body['execEndpoint']
            from docarray import DocumentArray

            query.data.docs = DocumentArray.from_dict(body['data'])
            answer = self._respond(query)
            if answer.header.status.exception.name == 'OverloadedError':
                return web.json_response(
                    answer.to_dict(), status=429, headers={'Retry-After': '1'}
                )  # ceil, as the gateway
            return web.json_response(answer.to_dict())

        async def websocket(request: web.Request):
            self.authorizations.append(request.headers.get('Authorization'))
            socket = web.WebSocketResponse(protocols=('bytes',))
            await socket.prepare(request)
            async for message in socket:
                if message.type == WSMsgType.BINARY and message.data != bytes(True):
                    if self._fail():
                        await socket.close(code=1011, message=b'warming up')
                        break
                    await asyncio.sleep(self.delay)
                    await socket.send_bytes(self._respond(DataRequest(message.data)).SerializeToString())
            return socket

        app = web.Application()
        app.router.add_post('/post', post)
        app.router.add_get('/', websocket)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, '127.0.0.1', self.port).start()
        self._stop = runner.cleanup
