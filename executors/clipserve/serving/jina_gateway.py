"""The gateway's doors into Jina's internals, beside jina_compat.py (the executors', the servers' defaults and
the command line's): every place the gateway reaches past Jina's public API, why, and the Jina version it
was checked against. Upgrading Jina means re-checking jina_compat.py and this file.

Checked against jina 3.34.0 (the last release, 2025-03). Each section names its user:

- the gateway's servers (gateway.py): gRPC options and interceptors, uvicorn's app and WebSocket message
  size, requests in flight per client stream (limits.py);
- one request through the gateway's streamer, cancellable down to the executor (openai_gateway.py).
"""

from __future__ import annotations

import asyncio
import collections

JINA_CHECKED = '3.34.0'


# ---- the gateway's servers (gateway.py) -------------------------------------------------------------


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


PREFETCH_METADATA = '__prefetch__'
_Metadatum = collections.namedtuple('_Metadatum', ['key', 'value'])  # as grpc.aio's invocation metadata items


def cap_stream_prefetch(streamer, cap: int) -> None:
    """At most `cap` requests of one client stream in flight at once (gRPC Call, WebSocket): Jina 3.34's
    streamer reads up to `prefetch` requests ahead (the gateway's --prefetch, 1000 by default), and a Jina
    client's own `prefetch` (clip-client: 100), sent as `__prefetch__` metadata, overrides it on gRPC; so one
    client could put 100 requests at once on replicas that hold fewer. Past the cap the stream waits
    (gRPC/WebSocket flow control), nothing is refused. gRPC calls get their metadata capped by CappedPrefetch."""
    inner = streamer._streamer  # RequestStreamer
    inner._prefetch = min(int(inner._prefetch or cap), int(cap))


class StreamCap:
    """A gRPC stream's request messages, read only while fewer than `cap` of its requests wait for their answers
    (`answered()` once per answer). Jina 3.34's streamer enforces its prefetch by reading the next message
    first and then looping on `asyncio.sleep(0)` until a place frees: a stream at its cap kept the gateway's
    event loop busy (half a core, taken from the replicas on the same machine; one clip-client at a cap of 8
    got half the image throughput). Here the read itself waits, on an event; Jina's prefetch is set one above
    (CappedPrefetch) so its loop never runs."""

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
    """A gRPC servicer context whose `__prefetch__` metadata is at most `cap` (the rest is the real context's)."""

    def __init__(self, context, cap: int):
        self._context = context
        self._cap = int(cap)

    def invocation_metadata(self):
        metadata, seen = [], False
        for item in self._context.invocation_metadata() or ():
            if item[0] == PREFETCH_METADATA:
                seen = True
                try:
                    asked = int(item[1])
                except ValueError:
                    asked = self._cap
                item = _Metadatum(item[0], str(min(max(asked, 1), self._cap)))
            metadata.append(item)
        if not seen:  # Jina would take the streamer's own prefetch, which StreamCap's one-above needs to pass
            metadata.append(_Metadatum(PREFETCH_METADATA, str(self._cap)))
        return tuple(metadata)

    def __getattr__(self, name):
        return getattr(self._context, name)


# ---- one request through the gateway's streamer (openai_gateway.py) -------------------------------


async def send_request(streamer, docs, endpoint: str, parameters: dict):
    """One data request through the gateway's streamer (its connection pool and graph): the response, or
    InternalNetworkError when no executor answered. Cancelling the caller cancels the request to the
    executors: Jina 3.34's `streamer.stream` runs each request in a task of its own that outlives its
    consumer, so a request whose client has gone would still be computed; here the caller awaits that task
    itself, whose cancellation reaches the gRPC calls to the executors (asyncio.gather of the graph's, and
    cancel_calls_with_their_requests for the calls themselves)."""
    from jina.types.request.data import DataRequest

    from clipserve.serving.jina_compat import answer_documents_type

    request = DataRequest()
    request.data.docs = docs
    request.header.exec_endpoint = endpoint
    request.parameters = parameters
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


def error_of(response) -> tuple[str, list[str]] | None:
    """(exception class name, args) of an executor's error carried in a response's header, or None."""
    from jina.proto import jina_pb2

    status = response.header.status
    if status.code != jina_pb2.StatusProto.ERROR:
        return None
    return status.exception.name, list(status.exception.args)
