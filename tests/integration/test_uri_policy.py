"""Remote fetching against a real HTTP server on loopback: allow-listing, redirects, slow and endless bodies."""

import http.server
import threading
import time

import pytest

from clipserve.inputs.uris import UriError, UriPolicy

from .conftest import TINY, make_image


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path in ('/image', '/png'):
            body = b'image-bytes' if self.path == '/image' else make_image(seed=4)
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith('/redirect?'):
            self.send_response(302)
            self.send_header('Location', self.path.split('?', 1)[1])
            self.end_headers()
        elif self.path == '/endless':
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b'x' * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path == '/drip':
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b'x')
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass


@pytest.fixture(scope='module')
def server():
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f'http://127.0.0.1:{httpd.server_address[1]}'
    httpd.shutdown()


def allowed(**kwargs):
    return UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.1',), **kwargs)


def test_loopback_is_refused_unless_allow_listed(server):
    with pytest.raises(UriError, match='non-public address 127.0.0.1'):
        UriPolicy(allow_remote=True).load(f'{server}/image')
    assert allowed().load(f'{server}/image') == b'image-bytes'
    assert UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.0/8',)).load(f'{server}/image') == b'image-bytes'


@pytest.mark.parametrize(
    'target, reason',
    [
        ('http://169.254.169.254/latest/meta-data/', 'non-public address 169.254.169.254'),
        ('http://10.1.2.3/x.jpg', 'non-public address 10.1.2.3'),
        ('http://[::1]/x.jpg', 'non-public address ::1'),
        ('file:///etc/passwd', 'not allowed|non-http'),
    ],
)
def test_redirects_to_forbidden_places_are_refused(server, target, reason):
    with pytest.raises(UriError, match=reason):
        allowed().load(f'{server}/redirect?{target}')


def test_redirect_within_the_allow_list_is_followed(server):
    assert allowed().load(f'{server}/redirect?{server}/image') == b'image-bytes'


def test_endless_body_is_cut_by_the_size_cap(server):
    with pytest.raises(UriError, match='larger than the limit of 1000000 bytes'):
        allowed(max_bytes=1_000_000).load(f'{server}/endless')


def test_slow_body_is_cut_by_the_total_timeout(server):
    started = time.monotonic()
    with pytest.raises(UriError, match='took longer than 1 s'):
        allowed(remote_timeout=1.0).load(f'{server}/drip')
    assert time.monotonic() - started < 8  # well before the 10 s the server would drip for


def test_executor_fetches_only_what_the_operator_allows(server):
    from docarray import Document, DocumentArray
    from jina import Client, Flow
    from jina.excepts import BadServer

    from clipserve import CLIPEncoder

    flow = Flow().add(
        uses=CLIPEncoder, uses_with={'name': TINY, 'allow_remote_uris': True, 'remote_allowed_hosts': ['127.0.0.1']}
    )
    with flow:
        client = Client(port=flow.port)
        out = client.post('/', DocumentArray([Document(uri=f'{server}/png')]))
        assert out[0].embedding.shape == (64,)
        with pytest.raises(BadServer, match='non-public address 169.254.169.254'):
            client.post('/', DocumentArray([Document(id='ssrf', uri=f'{server}/redirect?http://169.254.169.254/')]))
