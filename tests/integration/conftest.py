"""Real Flows on loopback for the integration tests, plus image fixtures the tests make themselves."""

import base64
import io
import socket

import numpy as np
import pytest
from PIL import Image

TINY = 'clipserve-tiny::random'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_image(width=64, height=48, seed=0, fmt='PNG') -> bytes:
    """A smooth gradient plus noise, so resampling has real work to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def data_uri(data: bytes, mime='image/png') -> str:
    return f'data:{mime};base64,' + base64.b64encode(data).decode()


@pytest.fixture(scope='session')
def tiny_flow():
    """One gateway serving gRPC and WebSocket; small limits so the limit paths are cheap to hit."""
    from jina import Flow

    from clipserve import CLIPEncoder

    ports = {'grpc': free_port(), 'websocket': free_port(), 'http': free_port()}
    flow = Flow(protocol=list(ports), port=list(ports.values())).add(
        name='encoder',
        uses=CLIPEncoder,
        uses_with={'name': TINY, 'minibatch_size': 4, 'num_worker_preprocess': 2, 'max_image_pixels': 4_000_000},
    )
    with flow:
        yield ports
