"""The shipped limits against one well-behaved client: flows/multi-protocol.yml as shipped (its gateway's and
replica's default limits), called by the unchanged clip-client 0.8.3 and by Jina's own HTTP client, which keep
up to 100 requests in flight (`prefetch`) of `batch_size` documents each. One client alone is never refused,
whatever its batch size. (clip-client's own HTTP mode is broken with jina 3.34 on the client: docs/troubleshooting.md.)"""

import numpy as np
import pytest
from clip_client import Client
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from .conftest import TINY, flow_from_yaml, free_port, health, set_port, wait_for


@pytest.fixture(scope='module')
def ports(tmp_path_factory):
    ports = [free_port() for _ in range(3)]
    with flow_from_yaml(
        'multi-protocol.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports), {'CLIPSERVE_MODEL': TINY}
    ):
        wait_for(lambda: health(ports[0]) == 'SERVING', 60, 'the Flow to be ready')
        yield dict(zip(['grpc', 'http', 'websocket'], ports))


def texts(batch_size: int) -> list[str]:
    """batch_size 3,000 with 100 requests in flight is 300,000 documents asked for at once, far over a replica's
    max_documents; batch_size 1 is 100 requests at once, over its max_requests."""
    return [f'caption {i}' for i in range(12_000 if batch_size > 1 else 300)]


@pytest.mark.parametrize('protocol,scheme', [('grpc', 'grpc'), ('websocket', 'ws')])
@pytest.mark.parametrize('batch_size', [1, 3_000])
def test_one_clip_client_is_never_refused_whatever_its_batch_size(ports, protocol, scheme, batch_size):
    sent = texts(batch_size)
    out = Client(f'{scheme}://127.0.0.1:{ports[protocol]}').encode(sent, batch_size=batch_size)
    assert out.shape == (len(sent), 64) and np.isfinite(out).all()


@pytest.mark.parametrize('batch_size', [1, 3_000])
def test_one_jina_http_client_is_never_refused_whatever_its_request_size(ports, batch_size):
    """Jina's HTTP client sends its 100 requests as 100 HTTP requests at once: the gateway lets a few of one
    client address through at a time (max_stream_requests), the others wait with their bodies unread."""
    docs = DocumentArray([Document(text=t) for t in texts(batch_size)])
    errors = []
    out = JinaClient(host='127.0.0.1', port=ports['http'], protocol='http').post(
        '/', docs, request_size=batch_size, prefetch=100, on_error=lambda r: errors.append(r.header.status.description)
    )
    assert errors == []
    assert len(out) == len(docs) and all(d.embedding is not None for d in out)
