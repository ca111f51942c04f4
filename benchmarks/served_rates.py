"""clipserve served on this machine (`clipserve serve`, gRPC and HTTP), and texts/s measured from clients.

`Served` starts `python -m clipserve serve` on a model (an export for onnx) with gRPC and HTTP on free loopback
ports, waits until `/readyz` answers 200, and stops it (SIGINT, then SIGKILL for the process group).
`texts_rate` keeps `clients` asyncio clients in this process posting requests of the same texts, each
client's next request sent when its last one is answered (closed loop): over gRPC, Jina's client posting
to `/encode` (what clip-client and Jina pipelines send); over HTTP, `/v1/embeddings` (what OpenAI-style
clients send). Every client finishes one request before the clock starts; the rate is the texts answered
over the elapsed time. The clients share the machine with the server, as on a 2-core CI machine they must;
asyncio clients in one thread keep their share small.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ('grpc', 'v1')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Served:
    """`clipserve serve` in a process group of its own, for the `with` block."""

    def __init__(self, model: str, backend: str = 'onnx', model_path: str | None = None, timeout: float = 600):
        self.grpc_port, self.http_port = free_port(), free_port()
        self.command = [sys.executable, '-m', 'clipserve', 'serve', '--model', model, '--backend', backend]
        self.command += ['--host', '127.0.0.1', '--port', str(self.http_port), '--grpc-port', str(self.grpc_port)]
        if model_path:
            self.command += ['--model-path', model_path]
        self.model, self.timeout = model, timeout

    def __enter__(self) -> Served:
        self.log = tempfile.TemporaryFile(mode='w+')
        env = {**os.environ, 'JINA_LOG_LEVEL': 'ERROR'}
        self.proc = subprocess.Popen(
            self.command, stdout=self.log, stderr=self.log, env=env, cwd=ROOT, start_new_session=True
        )
        deadline = time.monotonic() + self.timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                self.__exit__()
                raise RuntimeError(f'clipserve serve did not start:\n{self.log.read()[-3000:]}')
            time.sleep(1)  # a start-up poll, not a measurement
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f'http://127.0.0.1:{self.http_port}/readyz', timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def texts_rate(
    served: Served, protocol: str, clients: int, texts: list[str], seconds: float, passes: list | None = None
) -> float:
    """Texts/s answered with `clients` closed-loop clients sending `texts` per request over `protocol`; with
    `passes`, the window's forward passes are appended to it (window_passes)."""
    return asyncio.run(_rate(served, protocol, clients, texts, seconds, passes))


def images_rate(served: Served, clients: int, images: list[bytes], seconds: float, passes: list | None = None) -> float:
    """Images/s answered with `clients` closed-loop gRPC clients sending `images` (encoded files, as document
    blobs, the way clip-client sends local files) per request to /encode."""
    return asyncio.run(_rate(served, 'grpc', clients, images, seconds, passes))


async def replica_passes(served: Served) -> dict:
    """The replica's forward passes so far by kind (/clipserve/info: passes, rows, seconds in the model)."""
    from docarray import Document, DocumentArray
    from jina import Client

    client = Client(host='127.0.0.1', port=served.grpc_port, asyncio=True)
    async for answer in client.post('/clipserve/info', DocumentArray([Document()]), return_responses=True):
        return next(iter(answer.parameters['__results__'].values()))['passes']
    raise RuntimeError('/clipserve/info gave no answer')


def window_passes(before: dict, after: dict, elapsed: float) -> dict:
    """A window's passes by kind: how many, rows merged per pass, and the share of the window the model ran."""
    found = {}
    for kind in after:
        passes = after[kind]['passes'] - before[kind]['passes']
        if passes:
            rows, busy = after[kind]['rows'] - before[kind]['rows'], after[kind]['seconds'] - before[kind]['seconds']
            found[kind] = {'passes': passes, 'rows_per_pass': rows / passes, 'busy': busy / elapsed}
    return found


async def _rate(
    served: Served, protocol: str, clients: int, texts: list, seconds: float, passes: list | None = None
) -> float:
    senders = [await request_sender(served, protocol, texts) for _ in range(clients)]
    try:
        await asyncio.gather(*(send() for send, _ in senders))
        counts = [0] * clients
        before = await replica_passes(served) if passes is not None else None
        started = time.perf_counter()

        async def keep_sending(i: int) -> None:
            while time.perf_counter() - started < seconds:
                await senders[i][0]()
                counts[i] += len(texts)

        await asyncio.gather(*(keep_sending(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
        if passes is not None:
            passes.append(window_passes(before, await replica_passes(served), elapsed))
        return sum(counts) / elapsed
    finally:
        for _, close in senders:
            await close()


async def request_sender(served: Served, protocol: str, texts: list):
    """(send one request and check its answer, close) for one client; `texts` may hold encoded images (bytes),
    or nothing (over gRPC: a request of no document, answered without the model)."""
    if protocol == 'grpc':
        from docarray import Document, DocumentArray
        from jina import Client

        client = Client(host='127.0.0.1', port=served.grpc_port, asyncio=True)

        async def send() -> None:
            docs = DocumentArray([Document(blob=t) if isinstance(t, bytes) else Document(text=t) for t in texts])
            async for answer in client.post('/encode', docs):
                if len(answer) != len(texts) or (texts and answer.embeddings is None):
                    raise RuntimeError(f'/encode answered {len(answer)} documents without embeddings')

        async def close() -> None:
            return None

        return send, close
    if protocol == 'v1':
        import aiohttp

        session = aiohttp.ClientSession(f'http://127.0.0.1:{served.http_port}')
        body = {'input': texts}

        async def send() -> None:
            async with session.post('/v1/embeddings', json=body) as answer:
                found = await answer.json()
                if answer.status != 200 or len(found.get('data', ())) != len(texts):
                    raise RuntimeError(f'/v1/embeddings answered {answer.status}: {str(found)[:300]}')

        return send, session.close
    raise ValueError(f'protocol: one of {PROTOCOLS}, got {protocol!r}')
