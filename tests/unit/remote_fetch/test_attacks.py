"""The attacks an outside review reproduced against remote fetching, each replayed on loopback.

Every test here runs the real fetch code against real loopback servers; conftest.py's fixtures keep all
traffic on this machine (a resolver for the test's names only, a guard on connections outside loopback).
"""

import re
import socket
import time

import pytest

from clipserve.inputs import remote
from clipserve.inputs.uris import UriError, UriPolicy

from .servers import Server, answer, drip, standard

DEADLINE_BOUND = 3.0  # seconds a fetch with remote_timeout=1 may take at most: a bound on an attack, not a benchmark


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
    monkeypatch.setattr(remote, 'resolve', lambda host, port: time.sleep(5) or ['127.0.0.1'])
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
