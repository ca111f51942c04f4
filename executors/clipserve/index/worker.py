"""An embedded store in a process of its own, so building its search graph never stalls the server.

qdrant-edge-py 0.9 holds the interpreter lock for the whole of `optimize()` (seconds for 50,000 vectors,
minutes for millions): in the indexer's own process that would stop its event loop, its health answers and
every request. Here the shard lives in a child interpreter (`python -m clipserve.index.worker`) that the
parent talks to over its stdin/stdout (length-prefixed pickles, one call at a time). The child builds the
graph by itself once enough points are unindexed and no call has come for a moment; calls made meanwhile
wait for it (they are bounded by their deadlines upstream), while the parent keeps serving everything else.

The child dies with its parent (Linux: PR_SET_PDEATHSIG; elsewhere: at the end of its stdin), so a killed
executor never leaves a process holding the shard's write-ahead log; if the child dies, the next call
starts a new one, which reopens the shard from its log.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from clipserve.errors import ClipServeError, InvalidDocumentError, VectorStoreError, kind_named
from clipserve.index.store import CollectionSettings, VectorStore

HEADER = struct.Struct('!Q')
#: calls the parent may make (the store's interface, plus the child's own)
METHODS = ('upsert', 'update', 'delete', 'search', 'count', 'clear', 'status', 'optimize', 'unindexed', 'close')
WRITES = ('upsert', 'update', 'delete')


def send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream):
    (size,) = HEADER.unpack(_read_exactly(stream, HEADER.size))
    return pickle.loads(_read_exactly(stream, size))


def _read_exactly(stream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise EOFError('the other end closed the pipe')
        data += chunk
    return bytes(data)


class StoreProcess(VectorStore):
    """The VectorStore interface, answered by an EdgeStore in a child process (see the module's docstring)."""

    def __init__(
        self,
        folder: str | Path,
        settings: CollectionSettings = CollectionSettings(),
        optimize_after: int = 20_000,
        idle_seconds: float = 1.0,
    ):
        self.folder = str(folder)
        self.settings = settings
        self.optimize_after = int(optimize_after)
        self.idle_seconds = float(idle_seconds)
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        with self._lock:
            self._start()

    def _start(self) -> None:
        arguments = [self.folder, repr(asdict(self.settings)), str(self.optimize_after), str(self.idle_seconds)]
        self._process = subprocess.Popen(
            [sys.executable, '-m', 'clipserve.index.worker', *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        kind, value, settings = self._receive()
        if kind != 'ready':
            self._stop()
            raise _error(value)
        self.settings = settings

    def _receive(self):
        try:
            return receive(self._process.stdout)
        except (EOFError, OSError):
            self._died(self._process.wait())

    def _died(self, code: int):
        """Report the child's end once, whenever it is found (between calls or during one); the next call starts
        a new child, which reopens the shard from its write-ahead log."""
        self._stop()
        raise VectorStoreError(f'the index process for {self.folder} {_ended(code, self.folder)}') from None

    def call(self, method: str, *args):
        with self._lock:
            if self._process is not None and self._process.poll() is not None:
                self._died(self._process.returncode)  # it died since the last call: said now, not hidden
            if self._process is None:
                self._start()
            try:
                send(self._process.stdin, (method, args))
            except (BrokenPipeError, OSError):
                pass  # it died: _receive says how
            kind, value, settings = self._receive()
        self.settings = settings  # a first write decides the collection's size and kind
        if kind == 'error':
            raise _error(value)
        return value

    def upsert(self, points):
        return self.call('upsert', points)

    def update(self, points):
        return self.call('update', points)

    def delete(self, document_ids):
        return self.call('delete', document_ids)

    def search(self, queries, limit, filter_=None, ef=None):
        return self.call('search', queries, limit, filter_, ef)

    def count(self, filter_=None):
        return self.call('count', filter_)

    def clear(self):
        return self.call('clear')

    def status(self):
        return self.call('status')

    def optimize(self):
        return self.call('optimize')

    def unindexed(self) -> int:
        return self.call('unindexed')

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                try:
                    send(self._process.stdin, ('close', ()))
                    self._receive()
                except (OSError, VectorStoreError):
                    pass  # it is gone already
            self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ended(code: int, folder: str) -> str:
    """How the child ended, and what to do about it. The engine writes through memory-mapped files, so a full
    disk kills it with SIGBUS rather than failing the write: say so, with the space left."""
    how = (
        f'was killed by {signal.Signals(-code).name}'
        if code < 0 and -code in signal.valid_signals()
        else f'exited ({code})'
    )
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if code == -signal.SIGBUS or (free is not None and free < 64 * 1024 * 1024):
        room = f'{free // (1024 * 1024)} MiB free' if free is not None else 'unknown space free'
        return f'{how}: its disk is probably full ({room}); free space, then retry (what was acknowledged is kept)'
    return f'{how}; the next call restarts it (what was acknowledged is kept)'


def _error(value) -> Exception:
    """The child's error, as its own kind where it is one of clipserve's (errors.py), else VectorStoreError."""
    name, message = value
    kind = kind_named(name)
    return (
        kind(message) if kind is not ClipServeError and kind is not InvalidDocumentError else VectorStoreError(message)
    )


# ---- the child ----------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    if sys.platform.startswith('linux'):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() == 1:  # the parent died before the line above
        sys.exit(1)


def serve(folder: str, settings: CollectionSettings, optimize_after: int, idle_seconds: float) -> None:
    from clipserve.index.edge import EdgeStore

    _die_with_parent()
    inbox = io.open(sys.stdin.fileno(), 'rb', buffering=0, closefd=False)  # unbuffered: select() sees all
    outbox = io.open(sys.stdout.fileno(), 'wb', closefd=False)
    sys.stdout = sys.stderr  # nothing else may write to the parent's pipe
    try:
        store = EdgeStore(folder, settings)
    except Exception as error:
        send(outbox, ('error', (type(error).__name__, str(error)), settings))
        return
    send(outbox, ('ready', None, store.settings))
    pending = False  # written to since the last optimize
    while True:
        if pending:
            waiting, _, _ = select.select([inbox], [], [], idle_seconds)
            if not waiting:
                pending = False
                if store.unindexed() >= optimize_after:
                    store.optimize()
                continue
        try:
            method, args = receive(inbox)
        except EOFError:
            break
        if method not in METHODS:
            send(outbox, ('error', ('VectorStoreError', f'unknown index call {method!r}'), store.settings))
            continue
        try:
            value = getattr(store, method)(*args)
        except Exception as error:
            send(outbox, ('error', (type(error).__name__, str(error)), store.settings))
            continue
        pending = pending or method in WRITES
        send(outbox, ('ok', value, store.settings))
        if method == 'close':
            break
    store.close()


if __name__ == '__main__':
    import ast

    serve(sys.argv[1], CollectionSettings(**ast.literal_eval(sys.argv[2])), int(sys.argv[3]), float(sys.argv[4]))
