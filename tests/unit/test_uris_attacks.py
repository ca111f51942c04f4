"""The attacks an outside review reproduced against remote fetching, each replayed on loopback.

Every test here runs the real fetch code against real loopback servers. Two fixtures keep all traffic
on this machine: a resolver that answers only the test's names and numeric addresses (no DNS query
ever leaves), and a guard on socket.connect that fails the test on any connection attempt to an
address outside loopback.
"""

import ipaddress
import re
import socket
import ssl
import subprocess
import threading
import time

import pytest

from clipserve import uris
from clipserve.uris import UriError, UriPolicy

DEADLINE_BOUND = 3.0  # seconds a fetch with remote_timeout=1 may take at most: a bound on an attack, not a benchmark


class Forbidden(BaseException):
    """A connection attempt outside loopback; BaseException so no except clause in the code under test hides it."""


class Server:
    """A loopback HTTP server on raw sockets, so a test controls every byte and every pause of the answer.

    `respond(conn, path, headers)` writes the answer; requests are recorded as (path, headers) pairs.
    A `raw` server calls `respond(conn)` on accepting, before reading anything.
    """

    def __init__(self, respond, host='127.0.0.1', port=0, tls=None, raw=False):
        self.respond, self.tls, self.raw, self.requests = respond, tls, raw, []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.host, self.port = self.sock.getsockname()
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            conn.settimeout(15)
            if self.raw:
                return self.respond(conn)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b''
            while b'\r\n\r\n' not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            request_line, *lines = data.split(b'\r\n\r\n')[0].decode('latin-1').split('\r\n')
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(':') for line in lines)}
            self.requests.append((request_line.split(' ')[1], headers))
            self.respond(conn, request_line.split(' ')[1], headers)
        except (OSError, ssl.SSLError):
            pass  # the client went away (as it should, when it gives up on a slow answer)
        finally:
            conn.close()

    def close(self):
        self.stopped = True
        self.sock.close()


def answer(conn, status=200, body=b'', headers=()):
    head = f'HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n'
    head += ''.join(f'{k}: {v}\r\n' for k, v in headers)
    conn.sendall(head.encode() + b'\r\n' + body)


def drip(conn, data, every=0.1):
    for i in range(len(data)):
        conn.sendall(data[i : i + 1])
        time.sleep(every)


def standard(conn, path, headers):
    """/image -> b'image'; /redirect?<location> -> 302 there; /status/<n> -> Location /image with status n."""
    if path == '/image':
        answer(conn, body=b'image')
    elif path.startswith('/redirect?'):
        answer(conn, 302, headers=[('Location', path.split('?', 1)[1])])
    elif path.startswith('/status/'):
        answer(conn, int(path.rsplit('/', 1)[1]), headers=[('Location', '/image')])
    elif path == '/loop':
        answer(conn, 302, headers=[('Location', '/loop')])
    else:
        answer(conn, 404)


@pytest.fixture
def server():
    s = Server(standard)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def connections(monkeypatch):
    """Every address the code under test connects to; anything outside loopback fails the test."""
    attempts = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if isinstance(address, tuple):  # an IP socket (a Unix socket's address is a path)
            attempts.append(address[0])
            if not ipaddress.ip_address(str(address[0]).split('%')[0]).is_loopback:
                raise Forbidden(f'the code under test tried to connect to {address[0]}, outside loopback')

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, 'connect', connect)
    monkeypatch.setattr(socket.socket, 'connect_ex', connect_ex)
    return attempts


@pytest.fixture(autouse=True)
def dns(monkeypatch):
    """A resolver for names ending in .test: dns[name] = [first answer, second answer, ...], the last repeating.

    Numeric hosts and localhost are resolved for real (no query leaves the machine); other names fail.
    """
    answers, real = {}, socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        host = host.decode() if isinstance(host, bytes) else host
        port = int(port or 0)
        if host in answers:
            addresses = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
            return [
                (
                    socket.AF_INET6 if ':' in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    '',
                    (a, port, 0, 0) if ':' in a else (a, port),
                )
                for a in addresses
            ]
        if host == 'localhost':
            return real(host, port, family, type, proto, flags)
        try:
            return real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        except socket.gaierror:
            raise socket.gaierror(socket.EAI_NONAME, f'test resolver: unknown name {host!r}') from None

    monkeypatch.setattr(socket, 'getaddrinfo', getaddrinfo)
    return answers


# -- 1. DNS rebinding ---------------------------------------------------------------------------


@pytest.fixture
def good_and_secret():
    """A 'good' server on 127.0.0.2 and a 'secret' one on 127.0.0.1, on the same port number."""
    for _ in range(50):
        good = Server(
            lambda conn, path, headers: (
                standard(conn, path, headers) if path != '/image' else answer(conn, body=b'good')
            ),
            host='127.0.0.2',
        )
        try:
            secret = Server(lambda conn, path, headers: answer(conn, body=b'secret'), port=good.port)
            break
        except OSError:  # that port number is taken on 127.0.0.1; try another
            good.close()
    else:
        pytest.skip('no port number free on both 127.0.0.1 and 127.0.0.2')
    yield good, secret
    good.close()
    secret.close()


def rebinding_policy():
    return UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.2/32',), remote_timeout=5)


def test_dns_rebinding_cannot_reach_loopback(good_and_secret, dns):
    """The name answers the allowed 127.0.0.2 first, then 127.0.0.1: the fetch must use the checked answer."""
    good, secret = good_and_secret
    dns['rebind.test'] = [['127.0.0.2'], ['127.0.0.1']]
    assert rebinding_policy().load(f'http://rebind.test:{good.port}/image') == b'good'
    assert secret.requests == []
    assert good.requests[0][1]['host'] == f'rebind.test:{good.port}'  # the original Host header


def test_dns_rebinding_through_a_redirect(good_and_secret, dns):
    """The same on a redirect hop: the good server redirects to a name that rebinds to loopback."""
    good, secret = good_and_secret
    dns['hop.test'] = [['127.0.0.2'], ['127.0.0.1']]
    url = f'http://127.0.0.2:{good.port}/redirect?http://hop.test:{good.port}/image'
    assert rebinding_policy().load(url) == b'good'
    assert secret.requests == []
    assert good.requests[1][1]['host'] == f'hop.test:{good.port}'


def test_every_resolved_address_is_checked(good_and_secret, dns, connections):
    good, _ = good_and_secret
    dns['mixed.test'] = [['127.0.0.2', '127.0.0.1']]
    with pytest.raises(UriError, match=r'non-public address 127\.0\.0\.1 \(loopback\).*remote_allowed_hosts'):
        rebinding_policy().load(f'http://mixed.test:{good.port}/image')
    assert connections == []


def test_an_allow_listed_name_is_resolved_once_and_connected_to_as_resolved(good_and_secret, dns):
    good, secret = good_and_secret
    dns['named.test'] = [['127.0.0.2'], ['127.0.0.1']]
    policy = UriPolicy(allow_remote=True, allowed_hosts=('named.test',))
    assert policy.load(f'http://named.test:{good.port}/image') == b'good'
    assert secret.requests == []


# -- 2. One deadline for the whole fetch ---------------------------------------------------------


def assert_cut_by_the_deadline(url, **kwargs):
    policy = UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.1',), remote_timeout=1, **kwargs)
    started = time.monotonic()
    with pytest.raises(UriError, match='took longer than 1 s'):
        policy.load(url)
    assert time.monotonic() - started < DEADLINE_BOUND


def test_dripping_status_line_and_headers_are_cut_by_the_deadline():
    head = b'HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Pad: ' + b'a' * 60 + b'\r\n\r\nbody'
    s = Server(lambda conn, path, headers: drip(conn, head))
    assert_cut_by_the_deadline(f'http://127.0.0.1:{s.port}/image')
    s.close()


def test_dripping_body_is_cut_by_the_deadline():
    s = Server(
        lambda conn, path, headers: (
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 80\r\n\r\n'),
            drip(conn, b'x' * 80),
        )
    )
    assert_cut_by_the_deadline(f'http://127.0.0.1:{s.port}/image')
    s.close()


def test_a_server_that_never_answers_is_cut_by_the_deadline():
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(4)  # the kernel completes the handshake; nobody ever accepts or answers
    assert_cut_by_the_deadline(f'http://127.0.0.1:{listener.getsockname()[1]}/image')
    listener.close()


def test_a_slow_redirect_chain_is_cut_by_the_deadline():
    def slow_hops(conn, path, headers):
        time.sleep(0.9)  # each hop is within remote_timeout; their sum is not
        hop = int(path.rsplit('/', 1)[1])
        answer(conn, 302, headers=[('Location', f'/slow/{hop - 1}')]) if hop else answer(conn, body=b'image')

    s = Server(slow_hops)
    assert_cut_by_the_deadline(f'http://127.0.0.1:{s.port}/slow/4')
    s.close()


def test_a_dripping_tls_handshake_is_cut_by_the_deadline(dns):
    # A TLS record header announcing a 16000-byte handshake record, then its bytes one at a time.
    s = Server(lambda conn: (conn.recv(4096), drip(conn, b'\x16\x03\x03\x3e\x80' + b'\x00' * 80)), raw=True)
    dns['tls.test'] = [['127.0.0.1']]
    assert_cut_by_the_deadline(f'https://tls.test:{s.port}/image')
    s.close()


def test_a_slow_resolver_is_cut_by_the_deadline(monkeypatch):
    monkeypatch.setattr(uris, 'resolve', lambda host, port: time.sleep(5) or ['127.0.0.1'])
    assert_cut_by_the_deadline('http://slow-dns.test/image')


# -- 3. Addresses judged by the IPv4 address inside them; odd IPv4 spellings -----------------------


@pytest.mark.parametrize(
    'url, address',
    [
        ('http://[64:ff9b::7f00:1]/x', 'NAT64 form of the loopback address 127.0.0.1'),
        ('http://[64:ff9b::a9fe:a9fe]/x', 'NAT64 form of the link-local address 169.254.169.254'),
        ('http://[::127.0.0.1]/x', 'IPv4-compatible form of the loopback address 127.0.0.1'),
        ('http://[2002:a9fe:a9fe::]/x', '6to4 form of the link-local address 169.254.169.254'),
        ('http://[::ffff:127.0.0.1]/x', 'IPv4-mapped form of the loopback address 127.0.0.1'),
        ('http://[64:ff9b:1::808:808]/x', 'local-use NAT64'),
        ('http://2130706433/x', '127.0.0.1 (loopback)'),
        ('http://0x7f.1/x', '127.0.0.1 (loopback)'),
        ('http://127.1/x', '127.0.0.1 (loopback)'),
        ('http://017700000001/x', '127.0.0.1 (loopback)'),
        ('http://0/x', '0.0.0.0 (unspecified)'),
    ],
)
def test_non_public_addresses_in_any_spelling_are_refused_without_connecting(url, address, connections):
    with pytest.raises(UriError, match=f'non-public address .*{re.escape(address)}'):
        UriPolicy(allow_remote=True).load(url)
    assert connections == []


def test_a_redirect_to_an_embedded_loopback_address_is_refused_without_connecting(server, connections):
    with pytest.raises(UriError, match='NAT64 form of the loopback address 127.0.0.1'):
        UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.1',)).load(
            f'http://127.0.0.1:{server.port}/redirect?http://[64:ff9b::7f00:1]:{server.port}/image'
        )
    assert connections == ['127.0.0.1']  # the first hop only


def test_a_cidr_allow_list_matches_the_resolved_address(server, dns):
    dns['img.test'] = [['127.0.0.1']]
    url = f'http://img.test:{server.port}/image'
    with pytest.raises(UriError, match='non-public address 127.0.0.1'):
        UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.2/32', 'other.test')).load(url)
    assert UriPolicy(allow_remote=True, allowed_hosts=('127.0.0.0/8',)).load(url) == b'image'


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
    folder = tmp_path_factory.mktemp('tls-test')
    subprocess.run(
        [
            'openssl',
            'req',
            '-x509',
            '-newkey',
            'rsa:2048',
            '-nodes',
            '-keyout',
            str(folder / 'key.pem'),
            '-out',
            str(folder / 'cert.pem'),
            '-days',
            '2',
            '-subj',
            '/CN=tls.test',
            '-addext',
            'subjectAltName=DNS:tls.test',
        ],
        check=True,
        capture_output=True,
    )
    return str(folder / 'cert.pem'), str(folder / 'key.pem')


@pytest.fixture
def tls_server(tls_test_cert, monkeypatch):
    cert, key = tls_test_cert
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names = []
    context.sni_callback = lambda sslobj, name, ctx: names.append(name)
    # Trust the test certificate as the system store would trust a real one; the verification is real.
    monkeypatch.setattr(uris, '_tls_context', lambda: ssl.create_default_context(cafile=cert))
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
