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

from clipserve.serving.jina.compat import close_worker_server, worker_server


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


class DrainInstaller:
    """Installs the drain once Jina has built the server, before the replica answers anything.

    Jina builds the server right after the executor's constructor returns, and gives no hook then. The
    replica calls `install()` at the start of every request: the first one (the gateway's readiness
    probe, before the Flow can say ready) finds the server and installs the drain, so a SIGTERM that
    follows readiness always drains. A background poll installs it too when no request comes.
    """

    def __init__(self, executor, grace: float, on_drain, log, wait_seconds: float = 60.0):
        self._executor, self._grace, self._on_drain, self._log = executor, grace, on_drain, log
        self._lock = threading.Lock()
        self.settled = False  # installed, or found impossible (and said so)
        self._poll_until = time.monotonic() + wait_seconds
        threading.Thread(target=self._poll, name='clipserve-drain-setup', daemon=True).start()

    def install(self) -> None:
        if self.settled:
            return
        with self._lock:
            if self.settled:
                return
            installed = install_drain(self._executor, self._grace, self._on_drain)
            if installed:
                self._log.info(f'graceful shutdown on: requests in flight get up to {self._grace:g}s on SIGTERM/SIGINT')
            elif installed is False or time.monotonic() > self._poll_until:
                self._log.warning(
                    'graceful shutdown not installed (not a gRPC executor, or this Jina version holds its '
                    'server differently): requests in flight at SIGTERM are cut'
                )
            else:
                return
            self.settled = True

    def _poll(self) -> None:
        while not self.settled:
            self.install()
            time.sleep(0.5)
