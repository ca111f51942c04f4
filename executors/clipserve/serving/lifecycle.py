"""A replica's drain when it is told to stop: requests in flight finish, new ones go elsewhere.

Jina's worker, on SIGTERM or SIGINT, closes the executor first and then stops its gRPC server without
a grace period, so requests in flight are cut. `install_drain` replaces that shutdown of the one
server that runs this executor with: refuse new requests (so the gateway's readiness probe and its
retries move to the other replicas), let the requests in flight finish within the grace period, and
only then close the executor. It reaches the server through the objects that hold the executor,
because Jina hands the executor no reference to it; on a Jina whose objects differ it logs that the
drain is not installed and leaves Jina's shutdown as it is.
"""

from __future__ import annotations

import sys
import threading
import time

from clipserve.serving.jina_compat import close_worker_server, worker_server


def install_drain(executor, grace: float, on_drain) -> bool | None:
    """Make the worker's shutdown drain: stop taking requests, finish those in flight, then close.

    `on_drain()` runs first (the executor marks itself draining). Returns True when installed, None
    when the server is not built yet, False when it cannot be (the shutdown stays Jina's).
    """
    server = worker_server(executor)
    if not server:
        return server
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
        await close_worker_server(server)  # closes the executor, then tracing and metrics, as Jina's shutdown does
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
