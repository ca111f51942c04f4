"""Real Flows for both clients' tests (the light one: test_light_*, the Jina-protocol one: test_jina_*):
flows/multi-protocol.yml and flows/tls.yml with the tiny model, and an image server."""

import http.server
import importlib.util
import sys
import threading
import time

import numpy as np
import pytest

from tests.integration.conftest import ROOT, TINY, flow_from_yaml, free_port, make_image, set_port

if importlib.util.find_spec('clipserve_client') is None:
    # a checkout installed with the server's command only: the client (its own distribution, client/) from the tree
    sys.path.insert(0, str(ROOT / 'client'))

PROTOCOLS = ['grpc', 'http', 'websocket']
SCHEMES = {'grpc': 'grpc', 'http': 'http', 'websocket': 'ws'}


def url(protocol: str, port: int, tls: bool = False, host: str = '127.0.0.1') -> str:
    return f'{SCHEMES[protocol]}{"s" if tls else ""}://{host}:{port}'


@pytest.fixture(scope='session')
def plain_flow(tmp_path_factory):
    """gRPC, HTTP and WebSocket ports of one gateway: {'grpc': port, 'http': port, 'websocket': port}."""
    ports = [free_port() for _ in PROTOCOLS]
    flow = flow_from_yaml(
        'multi-protocol.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports), {'CLIPSERVE_MODEL': TINY}
    )
    with flow:
        yield dict(zip(PROTOCOLS, ports))


@pytest.fixture(scope='session')
def reference(tiny_backend):
    """The embeddings the server's model gives `texts`, computed here in-process."""
    from clipserve.models.tokenizer import Tokenizer

    tokenizer = Tokenizer()

    def embed(texts):
        tokens = tokenizer(list(texts))
        return np.asarray(tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask))

    return embed


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == '/slow.png':
            time.sleep(30)  # far past any fetch timeout a test sets: a bound on the caller's wait cannot race it
        if self.path == '/missing.png':
            self.send_error(404)
            return
        body = make_image() if self.path != '/big.png' else b'\0' * 50_000
        self.send_response(200)
        self.send_header('Content-Type', 'image/png')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope='session')
def image_server():
    """An http server of images: /<any>.png, /slow.png (30 s), /big.png (50 kB), /missing.png (404)."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
