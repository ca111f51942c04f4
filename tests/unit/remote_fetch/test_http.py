"""Remote fetching as HTTP: redirects followed by clipserve itself, the request it sends, the body's caps,
proxies ignored, and https verified for the name while connecting to the checked address. On loopback
only (conftest.py's fixtures)."""

import ssl
import time

import pytest

from clipserve.inputs import remote
from clipserve.inputs.uris import UriError, UriPolicy

from ...certificates import self_signed
from .servers import Server, answer, standard

DEADLINE_BOUND = 3.0  # seconds a refused body may take at most: a bound, not a benchmark


# -- Redirects, followed by the module itself ------------------------------------------------------


def policy():
    return UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.1',), remote_timeout=5)


@pytest.mark.parametrize('status', [301, 302, 303, 307, 308])
def test_redirect_statuses_are_followed_with_relative_locations(server, status):
    assert policy().load(f'http://127.0.0.1:{server.port}/status/{status}') == b'image'
    assert [path for path, _ in server.requests] == [f'/status/{status}', '/image']


def test_at_most_five_redirects(server):
    with pytest.raises(UriError, match='too many redirects'):
        policy().load(f'http://127.0.0.1:{server.port}/loop')
    assert len(server.requests) == 6  # the URL and five redirect hops


@pytest.mark.parametrize('target', ['file:///etc/passwd', 'ftp://127.0.0.1/x', 'gopher://127.0.0.1:6379/_x'])
def test_redirects_to_non_http_schemes_are_refused(server, target):
    with pytest.raises(UriError, match='non-http'):
        policy().load(f'http://127.0.0.1:{server.port}/redirect?{target}')


# -- The request and the body -------------------------------------------------------------------


def test_the_request_asks_for_an_identity_encoded_body(server):
    assert policy().load(f'http://127.0.0.1:{server.port}/image') == b'image'
    headers = server.requests[0][1]
    assert headers['accept-encoding'] == 'identity'
    assert headers['host'] == f'127.0.0.1:{server.port}'


def test_spaces_and_non_ascii_in_the_path_are_percent_encoded(server):
    with pytest.raises(UriError, match='HTTP 404'):
        policy().load(f'http://127.0.0.1:{server.port}/a b/\u00e9?q=[x]')
    assert server.requests[0][0] == '/a%20b/%C3%A9?q=[x]'


def chunked(conn, chunks):
    conn.sendall(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n')
    for chunk in chunks:
        conn.sendall(b'%x\r\n%s\r\n' % (len(chunk), chunk))
    conn.sendall(b'0\r\n\r\n')


def test_a_chunked_body_is_read_and_capped():
    s = Server(lambda conn, path, _: chunked(conn, [b'ab', b'cd', b'e'] if path == '/small' else [b'x' * 999] * 99))
    assert policy().load(f'http://127.0.0.1:{s.port}/small') == b'abcde'
    capped = UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.1',), max_bytes=10_000)
    with pytest.raises(UriError, match='larger than the limit of 10000 bytes'):
        capped.load(f'http://127.0.0.1:{s.port}/big')
    s.close()


def test_a_declared_length_over_the_cap_is_refused_before_reading():
    s = Server(
        lambda conn, path, headers: (
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n'),
            time.sleep(5),
        )
    )
    started = time.monotonic()
    with pytest.raises(UriError, match='larger than the limit'):
        policy().load(f'http://127.0.0.1:{s.port}/image')
    assert time.monotonic() - started < DEADLINE_BOUND
    s.close()


def test_http_errors_are_reported(server):
    with pytest.raises(UriError, match='the server answered HTTP 404'):
        policy().load(f'http://127.0.0.1:{server.port}/missing')


def test_proxy_environment_variables_are_not_honoured(server, monkeypatch):
    proxy = Server(lambda conn, path, headers: answer(conn, body=b'proxied'))
    for name in ('http_proxy', 'HTTP_PROXY', 'https_proxy', 'HTTPS_PROXY', 'all_proxy', 'ALL_PROXY'):
        monkeypatch.setenv(name, f'http://127.0.0.1:{proxy.port}')
    for name in ('no_proxy', 'NO_PROXY'):
        monkeypatch.delenv(name, raising=False)
    assert policy().load(f'http://127.0.0.1:{server.port}/image') == b'image'
    assert proxy.requests == []
    proxy.close()


# -- https: the connection goes to the checked address, TLS is for the name ---------------------------


@pytest.fixture(scope='module')
def tls_test_cert(tmp_path_factory):
    cert, key = self_signed(tmp_path_factory.mktemp('tls-test'), 'tls.test', 'DNS:tls.test')
    return str(cert), str(key)


@pytest.fixture
def tls_server(tls_test_cert, monkeypatch):
    cert, key = tls_test_cert
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names = []
    context.sni_callback = lambda sslobj, name, ctx: names.append(name)
    # Trust the test certificate as the system store would trust a real one; the verification is real.
    monkeypatch.setattr(remote, '_tls_context', lambda: ssl.create_default_context(cafile=cert))
    s = Server(standard, tls=context)
    s.sni = names
    yield s
    s.close()


def test_https_verifies_the_name_and_sends_it_as_sni(tls_server, dns):
    dns['tls.test'] = [['127.0.0.1']]
    assert policy().load(f'https://tls.test:{tls_server.port}/image') == b'image'
    assert tls_server.sni == ['tls.test']
    assert tls_server.requests[0][1]['host'] == f'tls.test:{tls_server.port}'


def test_https_refuses_a_certificate_for_another_name(tls_server, dns):
    dns['other.test'] = [['127.0.0.1']]
    with pytest.raises(UriError, match='CERTIFICATE_VERIFY_FAILED|certificate verify failed'):
        policy().load(f'https://other.test:{tls_server.port}/image')
    assert tls_server.requests == []
