"""The overload benchmark's load generators and the loops that drive them (open: on a schedule; closed: each
client's next request when its last is answered). Two generators, each `post(kind, docs)` -> the answer's
documents (or raises as Jina's client does: BadServer for an error answer, grpc's AioRpcError for a refusal):

- `JinaSender`: Jina's asyncio client, as clip-client uses it: every call opens a gRPC connection of its own,
  builds its request from DocumentArrays and parses the whole answer.
- `LeanSender`: one gRPC connection for every request; each kind's request serialized once (its documents
  fixed) and sent with a fresh request id, merged onto those bytes as protobuf merges concatenated messages;
  only answers that succeed are parsed into documents. It leaves more of a shared machine's cores to the
  Flow being measured, as clients on other machines would.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np

from benchmarks.overload_helpers import (
    ERROR,
    OK,
    Arrival,
    Outcome,
    classify,
    cpu_seconds,
    open_loop,
    percentile,
    small_arrivals,
)

SHORT = 'a photo of a small brown dog running on the beach'
PARAMETERS = {'drop_image_content': True}  # what clip-client sends
GRPC_UNLIMITED = [('grpc.max_send_message_length', -1), ('grpc.max_receive_message_length', -1)]


class JinaSender:
    def __init__(self, port: int, parameters: dict):
        from jina import Client

        self.client = Client(host='127.0.0.1', port=port, asyncio=True)
        self.parameters = parameters

    async def post(self, kind: str, docs):
        got = None
        async for answer in self.client.post('/', docs, request_size=len(docs), parameters=dict(self.parameters)):
            got = answer
        return got

    async def close(self) -> None:
        pass


class LeanSender:
    def __init__(self, port: int, parameters: dict, templates: dict):
        """`templates`: each kind's documents, sent as they are with every request of that kind."""
        import grpc

        self.channel = grpc.aio.insecure_channel(f'127.0.0.1:{port}', options=GRPC_UNLIMITED)
        self.call = self.channel.stream_stream('/jina.JinaRPC/Call')  # no (de)serializers: bytes both ways
        self.templates = templates
        self.requests = {kind: request_bytes(docs, parameters) for kind, docs in templates.items()}

    async def post(self, kind: str, docs=None):
        """Sends `kind`'s request (the template's documents: `docs` is ignored)."""
        from jina.excepts import BadServer
        from jina.proto import jina_pb2
        from jina.types.request.data import DataRequest

        fresh = jina_pb2.DataRequestProto()
        fresh.header.request_id = uuid.uuid4().hex
        answers = [a async for a in self.call(iter([self.requests[kind] + fresh.SerializeToString()]))]
        if not answers:
            raise RuntimeError('the gateway closed the call without an answer')
        answer = DataRequest(answers[-1])
        if answer.header.status.code >= jina_pb2.StatusProto.ERROR:
            raise BadServer(answer.header)
        return answer.docs

    async def close(self) -> None:
        await self.channel.close()


def request_bytes(docs, parameters: dict) -> bytes:
    """A Jina request to the default endpoint carrying `docs`, serialized."""
    from jina.types.request.data import DataRequest

    request = DataRequest()
    request.header.exec_endpoint = '/'
    request.parameters = dict(parameters)
    request.data.docs = docs
    return request.proto.SerializePartialToString()


# ---- the loops ------------------------------------------------------------------------------------------


def make_docs(kind: str, tag: str, jpeg: bytes):
    from docarray import Document, DocumentArray

    if kind == 'text':
        return DocumentArray([Document(id=f'{tag}-0', text=SHORT)])
    return DocumentArray([Document(id=f'{tag}-{i}', blob=jpeg) for i in range(8 if kind == 'large' else 1)])


def check_answer(sent, got) -> str | None:
    """None when `got` is `sent`'s documents, in order, each with a finite embedding; else what is wrong."""
    if got is None or [d.id for d in got] != [d.id for d in sent]:
        return 'the answer does not carry the documents sent'
    embeddings = got.embeddings
    if embeddings is None or embeddings.shape[0] != len(sent) or not np.isfinite(embeddings).all():
        return 'the answer lacks an embedding per document'
    return None


async def send(sender, outcome: Outcome, docs, start: float) -> None:
    """Post `docs` and record how it ended (times in seconds since `start`)."""
    try:
        got = await sender.post(outcome.kind, docs)
        outcome.ended = time.monotonic() - start
        problem = check_answer(docs, got)
        outcome.status, outcome.detail = (OK, '') if problem is None else (ERROR, problem)
    except asyncio.CancelledError:
        raise  # never answered: stays lost
    except Exception as error:  # noqa: BLE001 - every failure is classified and counted
        outcome.ended = time.monotonic() - start
        outcome.status, outcome.detail, outcome.limit, outcome.retry_after = classify(error)


def load_generator(port: int, jpeg: bytes, client: str):
    """(sender, docs(kind, tag)): `client` 'lean' sends each kind's one request (documents fixed) over one
    connection; 'jina' sends new documents with Jina's client, a connection per request (as clip-client)."""
    if client == 'lean':
        templates = {kind: make_docs(kind, kind, jpeg) for kind in ('large', 'text', 'image')}
        return LeanSender(port, PARAMETERS, templates), lambda kind, tag: templates[kind]
    return JinaSender(port, PARAMETERS), lambda kind, tag: make_docs(kind, tag, jpeg)


async def offer(port: int, schedule: list[Arrival], drain: float, jpeg: bytes, name: str, client: str):
    """The open loop of `schedule` against the Flow on `port`, from one asyncio load generator."""
    sender, docs = load_generator(port, jpeg, client)

    def request(outcome: Outcome, i: int, start: float):
        return send(sender, outcome, docs(outcome.kind, f'{name}-{i}'), start)

    try:
        return await open_loop(schedule, drain, request)
    finally:
        await sender.close()


async def closed_loop(
    port: int, clients: int, seconds: float, jpeg: bytes, executor_pid: int, client: str, small_rate: float = 0.0
) -> dict:
    """Large requests from `clients` clients back to back: requests/s answered (after one warm-up request
    each; the clock stops when the last request sent before the deadline is answered), and the executor's CPU
    time over the same interval. With `small_rate`, small requests (Poisson, half texts, half images) arrive
    at that rate meanwhile, as in an open loop: what the Flow sustains of large requests besides them."""
    sender, docs = load_generator(port, jpeg, client)
    outcomes: list[Outcome] = []

    async def keep_sending(i: int, start: float, stop: float | None):
        n = 0
        while True:
            outcome = Outcome('large', time.monotonic() - start, time.monotonic() - start)
            await send(sender, outcome, docs('large', f'closed-{i}-{n}'), start)
            n += 1
            if stop is None:
                return
            outcomes.append(outcome)
            if time.monotonic() >= stop:
                return

    def small(outcome: Outcome, i: int, start: float):
        return send(sender, outcome, docs(outcome.kind, f'closed-small-{i}'), start)

    await asyncio.gather(*(keep_sending(i, time.monotonic(), None) for i in range(clients)))
    start, cpu = time.monotonic(), cpu_seconds(executor_pid)
    smalls = asyncio.ensure_future(open_loop(small_arrivals(small_rate, seconds), 60.0, small))
    await asyncio.gather(*(keep_sending(i, start, start + seconds) for i in range(clients)))
    elapsed, cpu = time.monotonic() - start, cpu_seconds(executor_pid) - cpu
    small_outcomes = await smalls
    await sender.close()
    ok = [o for o in outcomes if o.status == OK]
    small_ok = [o for o in small_outcomes if o.status == OK]
    return {
        'requests_per_s': len(ok) / elapsed,
        'images_per_s': 8 * len(ok) / elapsed,
        'images': 8 * len(ok),
        'seconds': elapsed,
        'failed': len(outcomes) - len(ok),
        'p50_s': float(np.median([o.latency for o in ok])) if ok else float('nan'),
        'executor_cpu_s': cpu,
        'images_per_cpu_s': 8 * len(ok) / max(1e-9, cpu),  # large requests' images (small ones' work in the CPU)
        'small_rate': small_rate,
        'small_sent': len(small_outcomes),
        'small_failed': len(small_outcomes) - len(small_ok),
        'small_p99_s': percentile([o.latency for o in small_ok], 99),
    }
