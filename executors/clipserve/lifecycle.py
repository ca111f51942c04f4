"""A replica's life around its requests: a warm-up before it serves, and a drain when it is told to stop.

Jina's worker, on SIGTERM or SIGINT, closes the executor first and then stops its gRPC server without
a grace period, so requests in flight are cut. `install_drain` replaces that shutdown of the one
server that runs this executor with: refuse new requests (so the gateway's readiness probe and its
retries move to the other replicas), let the requests in flight finish within the grace period, and
only then close the executor. It reaches the server through the objects that hold the executor,
because Jina hands the executor no reference to it; on a Jina whose objects differ it logs that the
drain is not installed and leaves Jina's shutdown as it is.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
from docarray import Document, DocumentArray
from jina.serve.runtimes.servers import BaseServer


def warm_up_documents(image_size: int) -> DocumentArray:
    """One text and one image, run once at start so that the first real request is not the slow one."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
    return DocumentArray([Document(text='a photo of a cat'), Document(tensor=image)])


def _holders(obj, attribute: str):
    return [r for r in gc.get_referrers(obj) if not isinstance(r, dict) and getattr(r, attribute, None) is obj]


def _holder_dicts(obj, attribute: str):
    """Objects whose `attribute` is `obj` (gc sees the instance's __dict__ first, then the instance)."""
    found = []
    for namespace in gc.get_referrers(obj):
        if isinstance(namespace, dict) and namespace.get(attribute) is obj:
            found += [o for o in gc.get_referrers(namespace) if getattr(o, '__dict__', None) is namespace]
    return found + _holders(obj, attribute)


def find_worker_server(executor):
    """The server whose request handler runs `executor`: the server, None (not built yet) or False (the
    handler's server is not a gRPC one, e.g. an executor served over HTTP)."""
    for handler in _holder_dicts(executor, '_executor'):
        for server in _holder_dicts(handler, '_request_handler'):
            if hasattr(server, 'health_servicer') and hasattr(server, 'server'):
                return server
            return False
    return None


def install_drain(executor, grace: float, on_drain) -> bool | None:
    """Make the worker's shutdown drain: stop taking requests, finish those in flight, then close.

    `on_drain()` runs first (the executor marks itself draining). Returns True when installed, None
    when the server is not built yet, False when it cannot be (the shutdown stays Jina's).
    """
    server = find_worker_server(executor)
    if not server:
        return server
    handler = server._request_handler
    done = []

    async def draining_shutdown():
        if done:  # Jina's teardown may call shutdown twice
            return
        done.append(True)
        on_drain()
        _flush_output()  # stdout to a file or a pipe is block-buffered: say "draining" now, not at exit
        await server.health_servicer.enter_graceful_shutdown()  # NOT_SERVING on every service
        # grpc: no new RPCs from now on; those in flight get `grace` seconds to finish
        await server.server.stop(grace=grace)
        await handler.close()  # closes the executor
        await BaseServer.shutdown(server)  # tracing/metrics teardown, as Jina's shutdown does
        _flush_output()

    server.shutdown = draining_shutdown
    return True


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced by something without flush
            pass


def install_drain_when_served(executor, grace: float, on_drain, log, wait_seconds: float = 60.0) -> None:
    """Jina builds the server right after the executor's constructor returns: install the drain then."""

    def install():
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            installed = install_drain(executor, grace, on_drain)
            if installed:
                log.info(f'graceful shutdown on: requests in flight get up to {grace:g}s on SIGTERM/SIGINT')
                return
            if installed is False:
                break
            time.sleep(0.5)
        log.warning(
            'graceful shutdown not installed (not a gRPC executor, or this Jina version holds its '
            'server differently): requests in flight at SIGTERM are cut'
        )

    threading.Thread(target=install, name='clipserve-drain-setup', daemon=True).start()
