"""The gateway's doors into Jina's internals, beside jina/compat.py (the executors', the servers' defaults and
the command line's): every place the gateway reaches past Jina's public API, why, and the Jina version it
was checked against. Upgrading Jina means re-checking jina/compat.py and this file.

Checked against jina 3.34.0 (the last release, 2025-03). Each section names its user:

- the gateway's servers (gateways.py): gRPC options and interceptors, uvicorn's app and WebSocket message
  size, requests in flight per client stream (limits.py);
- one request through the gateway's streamer, cancellable down to the executor (flow_calls.py);
- every request on its way to an executor, screened by the replicas' mirrored admission (replica_room.py).
"""

from __future__ import annotations

import asyncio
import collections

JINA_CHECKED = '3.34.0'


# ---- the gateway's servers (gateways.py) -------------------------------------------------------------


def set_grpc_server_option(server, name: str, value) -> object:
    """Give one of Jina's gRPC servers a server option, over clipserve's defaults and the operator's
    `grpc_server_options` (Jina 3.34's GRPCServer keeps them as a dict and reads it in setup_server); returns
    the value it replaced, or None."""
    options = dict(server.grpc_server_options or {})
    replaced = options.get(name)
    options[name] = value
    server.grpc_server_options = options
    return replaced


def add_grpc_interceptors(server, interceptors) -> None:
    """Append server interceptors to one of Jina's gRPC servers (Jina 3.34's GRPCServer builds its grpc.aio
    server in setup_server with this list, which holds only its tracing interceptors)."""
    if not hasattr(server, 'grpc_tracing_server_interceptors'):
        raise RuntimeError(f'{type(server).__name__}: this jina version builds its gRPC server differently')
    server.grpc_tracing_server_interceptors = [*(server.grpc_tracing_server_interceptors or []), *interceptors]


def wrap_app_after_setup(server, wrap, ws_max_size: int | None = None) -> None:
    """FastAPI-based servers (HTTP, WebSocket) build their app and uvicorn's config in setup_server: wrap the
    app right after, before it serves, and set uvicorn's WebSocket message limit (Jina's WebSocket server
    passes 1 GiB as a keyword, so it cannot be given as uvicorn_kwargs; uvicorn reads it per connection)."""
    original = server.setup_server

    async def setup_server():
        await original()
        config = server.server.config  # uvicorn's
        if getattr(config, 'loaded', False):
            config.loaded_app = wrap(config.loaded_app)
        else:
            config.app = wrap(config.app)
        if ws_max_size is not None:
            config.ws_max_size = int(ws_max_size)

    server.setup_server = setup_server


def fastapi_app(app, depth: int = 6):
    """Jina's FastAPI app inside the ASGI app uvicorn loaded (uvicorn may wrap it: `.app` links), or None."""
    for _ in range(depth):
        if app is None or (hasattr(app, 'openapi') and hasattr(app, 'openapi_url')):
            return app
        app = getattr(app, 'app', None)
    return None


PREFETCH_METADATA = '__prefetch__'
_Metadatum = collections.namedtuple('_Metadatum', ['key', 'value'])  # as grpc.aio's invocation metadata items


def cap_stream_prefetch(streamer, cap: int) -> None:
    """At most `cap` requests of one client stream in flight at once (a gRPC Call, a WebSocket, HTTP's /stream),
    fewer where the client asks for fewer: Jina 3.34's streamer reads up to `prefetch` requests ahead (the
    gateway's --prefetch, 1000 by default), and a Jina client's own `prefetch` (clip-client: 100), sent as
    `__prefetch__` metadata, overrides it on gRPC; so one client could put 100 requests at once on replicas
    that hold fewer. Past the cap the stream waits (gRPC/WebSocket flow control), nothing is refused. Every
    stream goes through `streamer.rpc_stream`, which is wrapped here with StreamCap; Jina's own prefetch is set
    one above the cap, so its busy wait never runs (gRPC calls get their metadata from CappedPrefetch)."""
    inner = streamer._streamer  # RequestStreamer
    inner._prefetch = int(cap) + 1
    original = streamer.rpc_stream

    async def rpc_stream(*args, request_iterator, **kwargs):
        if not hasattr(request_iterator, '__aiter__'):  # built in the gateway (HTTP /post): one request, in memory
            async for response in original(*args, request_iterator=request_iterator, **kwargs):
                yield response
            return
        capped = StreamCap(request_iterator, getattr(kwargs.get('context'), 'stream_cap', cap))
        async for response in original(*args, request_iterator=capped, **kwargs):
            capped.answered()
            yield response

    streamer.rpc_stream = rpc_stream


class StreamCap:
    """A stream's requests, read only while fewer than `cap` of them wait for their answers (`answered()` once
    per answer). Jina 3.34's streamer enforces its prefetch by reading the next message first and then looping
    on `asyncio.sleep(0)` until a place frees: a stream at its cap kept the gateway's event loop busy (a full
    core, taken from the replicas on the same machine). Here the read itself waits, on an event."""

    def __init__(self, requests, cap: int):
        self._requests = requests.__aiter__()
        self._cap = int(cap)
        self._held = 0
        self._room = asyncio.Event()
        self._room.set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        while self._held >= self._cap:
            self._room.clear()
            await self._room.wait()
        request = await self._requests.__anext__()
        self._held += 1
        return request

    def answered(self) -> None:
        self._held = max(0, self._held - 1)
        self._room.set()


class CappedPrefetch:
    """A gRPC servicer context whose `__prefetch__` metadata is one above `stream_cap`, the client's own prefetch
    capped at `cap` (the rest is the real context's): StreamCap bounds the stream at `stream_cap`, Jina's busy
    wait one above never runs."""

    def __init__(self, context, cap: int):
        self._context = context
        self._metadata = []
        asked = None
        for item in context.invocation_metadata() or ():
            if item[0] == PREFETCH_METADATA:
                try:
                    asked = max(int(item[1]), 1)
                except ValueError:
                    asked = None
            else:
                self._metadata.append(item)
        self.stream_cap = min(asked or int(cap), int(cap))
        self._metadata.append(_Metadatum(PREFETCH_METADATA, str(self.stream_cap + 1)))

    def invocation_metadata(self):
        return tuple(self._metadata)

    def __getattr__(self, name):
        return getattr(self._context, name)


# ---- one request through the gateway's streamer (flow_calls.py) -------------------------------


async def send_request(streamer, docs, endpoint: str, parameters: dict, target: str | None = None):
    """One data request through the gateway's streamer (its connection pool and graph): the response, or
    InternalNetworkError when no executor answered. Cancelling the caller cancels the request to the
    executors: Jina 3.34's `streamer.stream` runs each request in a task of its own that outlives its
    consumer, so a request whose client has gone would still be computed; here the caller awaits that task
    itself, whose cancellation reaches the gRPC calls to the executors (asyncio.gather of the graph's, and
    cancel_calls_with_their_requests for the calls themselves)."""
    from jina.types.request.data import DataRequest

    from clipserve.serving.jina.compat import answer_documents_type

    request = DataRequest()
    request.data.docs = docs
    request.header.exec_endpoint = endpoint
    request.parameters = parameters
    if target:  # a regular expression of the executors that take it; the others pass it by
        request.header.target_executor = target
    inner = streamer._streamer  # RequestStreamer, built with the gateway's request and result handlers
    answer, floating = inner._request_handler(request=request, return_type=answer_documents_type())
    try:
        response = await answer
    except BaseException:  # cancelled, or no executor answered: executors that answer nobody stop too
        if floating is not None and not floating.done():
            floating.cancel()
        raise
    return inner._result_handler(response)


class _CancellingCall:
    """A unary gRPC call whose awaited trailing metadata, when cancelled, cancels the call itself."""

    def __init__(self, call):
        self._call = call

    async def trailing_metadata(self):
        try:
            return await self._call.trailing_metadata()
        except asyncio.CancelledError:
            self._call.cancel()
            raise

    def __await__(self):
        return self._call.__await__()

    def __getattr__(self, name):
        return getattr(self._call, name)


class _CancellingStub:
    def __init__(self, stub):
        self._stub = stub

    def process_single_data(self, *args, **kwargs):
        return _CancellingCall(self._stub.process_single_data(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._stub, name)


_cancels = False


def cancel_calls_with_their_requests() -> None:
    """Make a request cancelled at the gateway cancel its gRPC call to the executor. Jina 3.34's connection
    stubs (_ConnectionStubs.send_requests) await a unary call's trailing metadata before the call itself,
    and a cancelled wait for the metadata leaves the call running: the executor would go on computing a
    request whose client has gone. Each connection's unary stub is wrapped when Jina builds it (_init_stubs)."""
    global _cancels
    if _cancels:
        return
    from jina.serve.networking.connection_stub import _ConnectionStubs

    original = _ConnectionStubs._init_stubs

    async def _init_stubs(self):
        await original(self)
        if self.single_data_stub is not None and not isinstance(self.single_data_stub, _CancellingStub):
            self.single_data_stub = _CancellingStub(self.single_data_stub)

    _ConnectionStubs._init_stubs = _init_stubs
    _cancels = True


# ---- every request on its way to an executor (replica_room.py) -------------------------------------


def screen_executor_sends(streamer, room) -> None:
    """Pass every request the gateway sends to an executor (each protocol's, /v1's) through `room.enter`
    first (replica_room.ReplicaRoom), and answer the ones it refuses with its error, as an executor would.

    Jina 3.34's topology graph sends each request to each executor with its connection pool's
    `send_requests_once` (one task per request, awaited for `(response, trailing metadata)`); that method is
    wrapped on the gateway's pool. A refusal is the request itself with the error in its header (what an
    executor's error answer is: Jina's `add_exception`, documents as they came, the `is-error` metadata), so
    every client and gateway route reads it exactly as the replica's own."""
    pool = streamer._connection_pool
    original = pool.send_requests_once

    def send_requests_once(requests, deployment, *args, **kwargs):
        request = requests[0] if len(requests) == 1 and deployment in room.rooms else None
        verdict = room.enter(deployment, root_documents(request)) if request is not None else None
        if isinstance(verdict, BaseException):
            request.add_exception(verdict)
            request.header.status.exception.executor = room.rooms[deployment].executor
            answered = asyncio.get_running_loop().create_future()
            answered.set_result((request, {'is-error': 'true'}))
            return answered
        task = original(requests, deployment, *args, **kwargs)
        if verdict:
            if task is None:  # no connection to send it on
                room.leave(deployment)
            else:
                task.add_done_callback(lambda _: room.leave(deployment))
        return task

    pool.send_requests_once = send_requests_once


def root_documents(request) -> int | None:
    """The number of root documents in a Jina DataRequest, without building them (None: not a request of
    documents, or one that cannot be read). upb parses a request without copying its documents' bytes."""
    from jina.proto import jina_pb2
    from jina.types.request.data import DataRequest

    if not isinstance(request, DataRequest):
        return None
    try:
        if request.is_decompressed_with_data:
            proto = request.proto_with_data
        elif request.buffer is not None:
            proto = jina_pb2.DataRequestProto.FromString(request.buffer)
        else:  # parsed without its data (header and parameters only): the data is still in its serialization
            proto = jina_pb2.DataRequestProto.FromString(request.proto_wo_data.SerializePartialToString())
        if proto.data.WhichOneof('documents') != 'docs':
            return None
        return len(proto.data.docs.docs)
    except Exception:  # noqa: BLE001 - unreadable here: the executor judges it, as before
        return None


def error_of(response) -> tuple[str, list[str]] | None:
    """(exception class name, args) of an executor's error carried in a response's header, or None."""
    from jina.proto import jina_pb2

    status = response.header.status
    if status.code != jina_pb2.StatusProto.ERROR:
        return None
    return status.exception.name, list(status.exception.args)
