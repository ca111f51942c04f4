"""The one door to Jina's internals: every place clipserve reaches past Jina's public API, why, and the
Jina version it was checked against. Upgrading Jina means re-checking this file, not the whole package.

Checked against jina 3.34.0 (the last release, 2025-03). Each section names its user:

- gRPC server options (every server Jina builds in clipserve's processes): message size, ping policy;
- endpoint handlers (replica/routing.py): Jina's wrapper for a function it can call as an endpoint; the logger
  Jina's worker logs an endpoint's exceptions with (replica/error_logs.py);
- the executor's own server (replica/lifecycle.py's drain): Jina hands an executor no reference to it;
- one request to one executor or head (gateway/readiness.py's probe): Jina's data request, channel and stub;
- network errors (gateway/flow_calls.py) and running a Flow from a file (the command line);
- DocArray v2 and pydantic 2 (replica/executors_v2.py, clipserve/__init__.py): Jina's gateway models with pydantic
  >= 2.11, and the empty request / answer types of either flavour;
- a head merging its shards' answers (replica/indexer.py: the shards' matches sorted and cut to the top k);
- `py_modules` names (the command line): Jina looks each name up as a file before it imports it as a module,
  in the folders of its call stack and on PATH, so `py_modules: [clipserve]` finds the `clipserve` command
  (in a virtual environment's bin/, on PATH in the images) and fails importing it. The shipped Flows name
  `clipserve.serving`; `shadowed_py_modules` finds a YAML's names that such a file would shadow.
"""

from __future__ import annotations

import gc
import logging
import os

from clipserve import environment

JINA_CHECKED = '3.34.0'
MAX_MESSAGE_ENV = environment.MAX_GRPC_MESSAGE_BYTES.name
DEFAULT_MAX_MESSAGE_BYTES = 100 * 1024 * 1024

logger = logging.getLogger(__name__)


def grpc_server_defaults(environ=None) -> dict:
    """The gRPC server options clipserve adds to Jina's (an operator's `grpc_server_options` win over both).

    - `grpc.max_receive_message_length`: Jina sets -1 (any size), so one client could make a server buffer
      a message as large as it likes before any check (the token's included) sees it. gRPC refuses a larger
      message from its length prefix, before reading it.
    - the ping policy: Jina's clients send keepalive pings every 10 s, and Jina's servers mean to allow them,
      but name the options `grpc.http1.*`, which gRPC does not know; its defaults (at most one ping per
      5 minutes without data, two strikes) then close idle client connections with GOAWAY too_many_pings.
    """
    environ = os.environ if environ is None else environ
    limit = max_message_bytes(environ)
    return {
        'grpc.max_receive_message_length': limit,
        'grpc.http2.min_ping_interval_without_data_ms': 5000,
        'grpc.http2.max_ping_strikes': 0,
    }


def max_message_bytes(environ=None) -> int:
    from clipserve.config.parameters import check_int, env_or_default

    environ = os.environ if environ is None else environ
    value = env_or_default(environ.get(MAX_MESSAGE_ENV), DEFAULT_MAX_MESSAGE_BYTES)
    return check_int(MAX_MESSAGE_ENV, value, minimum=1024)


_installed = False


def install_grpc_server_defaults() -> None:
    """Make every gRPC server Jina builds in this process start from `grpc_server_defaults()`.

    Jina 3.34 builds its servers' options with `get_server_side_grpc_options(args.grpc_server_options)`,
    imported by name into `jina.serve.runtimes.servers.grpc` (executors, heads, the gRPC gateway). This
    wraps that name; it runs when clipserve is imported, which Jina does (py_modules) before it builds the
    server of an executor or of a gateway.
    """
    global _installed
    if _installed:
        return
    from jina.serve.runtimes.servers import grpc as jina_grpc

    original = jina_grpc.get_server_side_grpc_options

    def with_clipserve_defaults(additional_options=None):
        merged = dict(original(None))
        merged.update(grpc_server_defaults())
        if isinstance(additional_options, dict):
            merged.update(additional_options)
        elif additional_options:
            merged.update(dict(additional_options))
        return list(merged.items())

    jina_grpc.get_server_side_grpc_options = with_clipserve_defaults
    _installed = True


# ---- endpoint handlers (replica/routing.py) and concurrency (replica/executors.py) ------------------------------


def allow_concurrent_requests(executor) -> None:
    """Let Jina run the executor's (synchronous) endpoints for several requests at once, as
    `allow_concurrent: true` does: Jina 3.34 otherwise takes an asyncio.Lock (`executor._lock`) around
    each call. clipserve's executors are thread-safe (one model thread behind a scheduler), and requests
    must run together to share forward passes."""
    import contextlib

    executor._lock = contextlib.AsyncExitStack()


_reduce_hooks: list = []


def install_reduce_hook(hook) -> None:
    """Run `hook(docs, parameters)` on every answer a head merges from its shards, after Jina's own reduce;
    a hook returning documents replaces the answer's. Jina 3.34's head merges shards' answers with
    `WorkerRequestHandler.reduce_requests` (DocArray's reduce: matches concatenated, never sorted, never cut),
    a static method it calls through the class: wrapped here once per process. A Flow's heads load what the
    Flow's YAML names in `py_modules` (forked from the process that read it, or, spawned, by unpickling the
    executor classes Jina hands every pod), so an executor module that installs a hook at import reaches them.
    """
    if hook in _reduce_hooks:
        return
    _reduce_hooks.append(hook)
    from jina.serve.runtimes.worker.request_handling import WorkerRequestHandler

    original = WorkerRequestHandler.reduce_requests
    if getattr(original, '_clipserve_hooks', None) is _reduce_hooks:
        return

    def reduce_requests(requests):
        response = original(requests)
        for each in _reduce_hooks:
            docs = each(response.docs, response.parameters)
            if docs is not None:
                WorkerRequestHandler.replace_docs(response, docs)
        return response

    reduce_requests._clipserve_hooks = _reduce_hooks
    WorkerRequestHandler.reduce_requests = staticmethod(reduce_requests)


def worker_logger(executor) -> logging.Logger | None:
    """The logger Jina's worker logs an endpoint's exceptions with (Jina 3.34: a JinaLogger named after the
    runtime, i.e. a `logging.Logger` of that name), or None for an executor built outside a Jina worker."""
    name = getattr(getattr(executor, 'runtime_args', None), 'name', None)
    return logging.getLogger(name) if name else None


def endpoint_handler(function):
    """`function(executor, **kwargs)` as an entry of an executor's endpoint table (Jina's `requests`)."""
    from jina.serve.executors import _FunctionWithSchema

    return _FunctionWithSchema.get_function_with_schema(function)


# ---- the executor's server (replica/lifecycle.py) ---------------------------------------------------------


def _holders(obj, attribute: str):
    return [r for r in gc.get_referrers(obj) if not isinstance(r, dict) and getattr(r, attribute, None) is obj]


def _holder_dicts(obj, attribute: str):
    """Objects whose `attribute` is `obj` (gc sees the instance's __dict__ first, then the instance)."""
    found = []
    for namespace in gc.get_referrers(obj):
        if isinstance(namespace, dict) and namespace.get(attribute) is obj:
            found += [o for o in gc.get_referrers(namespace) if getattr(o, '__dict__', None) is namespace]
    return found + _holders(obj, attribute)


def worker_server(executor):
    """The gRPC server whose request handler runs `executor` (Jina 3.34: server._request_handler._executor):
    the server, None (not built yet) or False (not a gRPC server, e.g. an executor served over HTTP).
    Found through the objects that hold the executor, because Jina hands the executor no reference to it."""
    for handler in _holder_dicts(executor, '_executor'):
        for server in _holder_dicts(handler, '_request_handler'):
            if hasattr(server, 'health_servicer') and hasattr(server, 'server'):
                return server
            return False
    return None


async def close_worker_server(server) -> None:
    """What Jina's own shutdown of a worker's server does after stopping it: close the request handler (and
    so the executor), then tear down tracing and metrics."""
    from jina.serve.runtimes.servers import BaseServer

    await server._request_handler.close()
    await BaseServer.shutdown(server)


# ---- one request to one executor or head (gateway/readiness.py) ------------------------------------------


async def post_to_executor(address: str, endpoint: str, timeout: float):
    """Send an empty request for `endpoint` straight to one executor or head ('host:port', 'grpcs://...');
    returns the answer's documents, raises RuntimeError on an error answer, gRPC errors on no answer."""
    from jina.proto import jina_pb2, jina_pb2_grpc
    from jina.serve.networking.utils import get_grpc_channel
    from jina.types.request.data import DataRequest

    request = DataRequest()
    request.header.exec_endpoint = endpoint
    request.data.docs = empty_documents()  # v1 or v2 (the DocArray v2 section below)
    target, tls = address.split('://', 1)[-1], address.startswith('grpcs://')
    async with get_grpc_channel(target, asyncio=True, tls=tls) as channel:
        stub = jina_pb2_grpc.JinaSingleDataRequestRPCStub(channel)
        # a head picks its polling (ANY / ALL shards) by the `endpoint` metadata, as the gateway sends it
        answer = await stub.process_single_data(request, metadata=(('endpoint', endpoint),), timeout=timeout)
    if answer.header.status.code == jina_pb2.StatusProto.ERROR:
        raise RuntimeError(answer.header.status.exception.name or 'error')
    return answer.docs


# ---- network errors (gateway/flow_calls.py) and Flows (the command line) ----------------------------


def network_error_types() -> tuple[type, ...]:
    """What the gateway's streamer raises when the executors cannot be reached or time out."""
    from jina.excepts import InternalNetworkError

    return (InternalNetworkError,)


def shadowed_py_modules(yaml_text: str, search: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, file) for each bare `py_modules` name of the YAML that Jina would resolve to a file that is not a
    module (jina/jaml/helper.py complete_path: the call stack's folders, then PATH), as a command is."""
    import re
    import sys
    from pathlib import Path

    names, listing = [], False
    for line in yaml_text.splitlines():
        inline = re.match(r'^\s*(?:-\s*)?py_modules:\s*\[([^\]]*)\]', line)
        if inline:
            names += [n.strip().strip('\'"') for n in inline.group(1).split(',')]
            continue
        if re.match(r'^\s*(?:-\s*)?py_modules:\s*(#.*)?$', line):
            listing = True
            continue
        item = re.match(r'^\s*-\s*([^#\s]+)\s*(#.*)?$', line) if listing else None
        if item:
            names.append(item.group(1).strip('\'"'))
        else:
            listing = False
    folders = (
        search if search is not None else [str(Path(sys.argv[0]).parent), *os.environ.get('PATH', '').split(os.pathsep)]
    )
    found = []
    for name in dict.fromkeys(n for n in names if n.isidentifier()):
        for folder in folders:
            candidate = Path(folder or '.') / name
            if candidate.is_file():
                found.append((name, str(candidate)))
                break
    return found


def serve_flow(path: str) -> None:
    """Start the Flow in the YAML file `path` and serve until interrupted (`jina flow --uses path`).

    clipserve's executors are registered first: the package was imported before Jina here, so importing it
    again for the YAML's `py_modules` would not define them (see clipserve/__init__.py); the caller imports
    serving/gateway/gateways.py first for the gateways (an import from here would close a circle). The path is made
    absolute (Jina 3.34 fails on a bare file name). On interruption the executors are closed before the
    gateway: Jina closes the gateway first, which cuts off the answers of requests still in flight.
    """
    from importlib import import_module
    from pathlib import Path

    from jina import Flow

    from clipserve.serving.jina.flavour import executors_module, indexer_module, installed

    import_module(executors_module())  # the installed DocArray flavour's executors (flavour.py)
    import_module(indexer_module())
    if installed() == 'v1':
        import_module('clipserve.serving.replica.reranker')  # CrossEncoderRanker: the v1 flavour only

    with Flow.load_config(str(Path(path).resolve())) as flow:
        flow.block()
        for name, deployment in list(flow):
            if name != 'gateway':
                deployment.close()


# ==== DocArray v2 and pydantic 2 (issue 33) =========================================================
# Jina 3.34 in docarray-v2 mode builds pydantic models for its HTTP and WebSocket gateways with
# `pydantic.create_model(..., __config__=C)`, C a pydantic-v1-style `BaseConfig` subclass: at the import of
# jina/serve/runtimes/gateway/models.py (CustomConfig) and in http_fastapi_app_docarrayv2.py (InnerConfig),
# when the app is built. pydantic <= 2.10 converted such a class (with deprecation warnings); pydantic >= 2.11
# raises `TypeError: '_ConfigMetaclass' object is not iterable`, so the gateway never starts.


def v1_config_as_dict(config) -> dict:
    """A pydantic-v1 config class as pydantic 2's ConfigDict: what pydantic <= 2.10 did, with v1 names
    renamed to v2's (`allow_population_by_field_name` -> `validate_by_name`) and removed keys (`fields`) dropped."""
    from pydantic import ConfigDict

    try:
        from pydantic._internal._config import V2_REMOVED_KEYS, V2_RENAMED_KEYS
    except ImportError:  # pragma: no cover - older or newer pydantic 2: the keys Jina 3.34 uses
        V2_REMOVED_KEYS, V2_RENAMED_KEYS = {'fields'}, {'allow_population_by_field_name': 'populate_by_name'}
    items = {k: getattr(config, k) for k in dir(config) if not k.startswith('__')}
    return ConfigDict(**{V2_RENAMED_KEYS.get(k, k): v for k, v in items.items() if k not in V2_REMOVED_KEYS})


def install_pydantic_compat() -> bool:
    """Wrap `pydantic.create_model` so that a `BaseConfig` class given as `__config__` becomes a ConfigDict;
    every other call is passed on untouched (a call the wrapper changes is one pydantic >= 2.11 refuses).
    Must run before Jina first imports its gateway models (it does when it builds an HTTP or WebSocket
    app); clipserve's package does it when imported with Jina (py_modules). True when installed (now or before)."""
    import pydantic

    if getattr(pydantic.create_model, '_clipserve_compat', False):
        return True
    if not pydantic.VERSION.startswith('2.') or tuple(int(x) for x in pydantic.VERSION.split('.')[1:2]) < (11,):
        return False  # pydantic 1, or 2.x < 2.11: Jina's calls work as they are
    from pydantic import BaseConfig

    original = pydantic.create_model

    def create_model(*args, __config__=None, **kwargs):
        if isinstance(__config__, type) and issubclass(__config__, BaseConfig):
            __config__ = v1_config_as_dict(__config__)
        return original(*args, __config__=__config__, **kwargs)

    create_model._clipserve_compat = True
    create_model.__wrapped__ = original
    pydantic.create_model = create_model
    return True


def empty_documents():
    """An empty document list of the installed flavour, for a request that carries none (readiness probes)."""
    from jina._docarray import docarray_v2

    if docarray_v2:
        from docarray import BaseDoc, DocList

        return DocList[BaseDoc]()
    from docarray import DocumentArray

    return DocumentArray()


def answer_documents_type():
    """What a gateway-side request asks its answer's documents to be: v1's DocumentArray; in v2 an untyped
    DocList, which Jina's gateway casts to each endpoint's output schema (the executors' schemas.py types)."""
    from jina._docarray import DocumentArray  # v2: docarray.DocList

    return DocumentArray
