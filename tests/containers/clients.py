"""What the container tests send and how they compare: clip-client 0.8.3 over gRPC, the openai SDK over
HTTP, and cosine similarity to the same inputs served by a Flow run from source."""

from __future__ import annotations

import numpy as np
from docarray import Document, DocumentArray

from ..integration.conftest import data_uri, make_image

TINY = 'clipserve-tiny::random'
TEXTS = ['a photo of a dog', 'a diagram', 'a much longer caption about a dog sitting on a red chair']
IMAGES = [make_image(300, 200, seed=1), make_image(seed=2)]
MIN_COSINE = 0.99999


def clip_client_embeddings(port: int) -> np.ndarray:
    """TEXTS then IMAGES (a blob and a data URI) through clip-client: one row each."""
    from clip_client import Client

    client = Client(f'grpc://127.0.0.1:{port}')
    texts = client.encode(TEXTS)
    images = client.encode(DocumentArray([Document(blob=IMAGES[0]), Document(uri=data_uri(IMAGES[1]))])).embeddings
    return np.concatenate([texts, images])


def openai_embeddings(http_port: int) -> np.ndarray:
    """TEXTS then IMAGES (as data URIs) through the openai SDK's embeddings.create."""
    import openai

    client = openai.OpenAI(base_url=f'http://127.0.0.1:{http_port}/v1', api_key='unused', max_retries=0, timeout=60)
    try:
        answer = client.embeddings.create(model=TINY, input=TEXTS + [data_uri(image) for image in IMAGES])
    finally:
        client.close()
    return np.array([row.embedding for row in answer.data])


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    assert got.shape == want.shape, (got.shape, want.shape)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def executor_info(port: int) -> dict:
    """/clipserve/info of the Flow behind the gateway: {executor copy: its facts}."""
    from jina import Client

    responses = Client(host='127.0.0.1', port=port).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    return responses[0].parameters['__results__']
