"""Remote fetches, made here rather than by urllib so that the address that was checked is the address that
is connected to: every hop (the URL and each redirect) is resolved once, every address it resolves to must
pass addresses.py (public, or allow-listed), and the connection goes to one of those addresses. Proxy
environment variables are ignored: fetches always go direct. One deadline bounds the whole fetch (resolving,
connecting, TLS, headers, redirects and body), and the body is cut at the size cap.
"""

from __future__ import annotations

import functools
import http.client
import socket
import ssl
import threading
import time
import urllib.parse

from clipserve.inputs.addresses import ascii_host, check_addresses
from clipserve.inputs.data_uris import UriError

MAX_REDIRECTS = 5
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_PRINTABLE_ASCII = ''.join(map(chr, range(0x21, 0x7F)))


class _Timeout(Exception):
    """The fetch deadline passed; turned into a UriError naming remote_timeout."""


def fetch(url: str, timeout: float, max_bytes: int, allowed_hosts: tuple[str, ...] = ()) -> bytes:
    """GET `url` within `timeout` seconds in all, at most `max_bytes`; any failure, of the policy or of the
    network, is a UriError."""
    watchdog = _Watchdog(timeout)
    try:
        body = _follow(url, watchdog, max_bytes, allowed_hosts)
        watchdog.stop()
        if watchdog.fired:  # the socket was cut, so the body may be short
            raise _Timeout()
        return body
    except Exception as e:
        watchdog.stop()
        if watchdog.fired or isinstance(e, (_Timeout, TimeoutError)):
            raise UriError(f'fetching the URI took longer than {timeout:g} s') from e
        if isinstance(e, UriError):
            raise
        raise UriError(f'fetching the URI failed: {type(e).__name__}: {e}') from e


def _follow(url: str, watchdog: _Watchdog, max_bytes: int, allowed_hosts: tuple[str, ...]) -> bytes:
    """Follow redirects ourselves, so each hop is resolved, checked and connected to like the first."""
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ('http', 'https'):
            raise UriError(f'redirect to a non-http URI refused: {url}')
        host = ascii_host(parts.hostname or '')
        try:
            port = parts.port or (443 if scheme == 'https' else 80)
        except ValueError:
            raise UriError(f'invalid port in URL {url!r}') from None
        addresses = _resolve_within(host, port, watchdog.remaining())  # once: the checked answer is used
        check_addresses(host, addresses, allowed_hosts)
        status, location, body = _get(scheme, host, port, parts, addresses, watchdog, max_bytes)
        if status not in _REDIRECT_STATUSES:
            return body
        if not location:
            raise UriError(f'the server answered {status} without a Location to redirect to')
        url = urllib.parse.urljoin(url, location.strip())
    raise UriError(f'too many redirects (more than {MAX_REDIRECTS})')


def _get(
    scheme: str,
    host: str,
    port: int,
    parts: urllib.parse.SplitResult,
    addresses: list[str],
    watchdog: _Watchdog,
    max_bytes: int,
) -> tuple[int, str | None, bytes]:
    """One GET over a connection to one of the checked `addresses`: (status, Location, body)."""
    sock, error = None, None
    for address in addresses:
        try:
            sock = connect(address, port, watchdog.remaining())
            break
        except OSError as e:
            error = e
    if isinstance(error, TimeoutError) and sock is None:
        raise _Timeout()  # connect was given the time that remained
    if sock is None:
        raise UriError(f'cannot connect to {host!r} port {port}: {error}')
    watchdog.watch(sock)
    connection = response = None
    try:
        if scheme == 'https':
            # SNI and certificate verification are for the name in the URL, not the address.
            sock = _tls_context().wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
            watchdog.watch(sock)
            sock.do_handshake()
        connection = http.client.HTTPConnection(host, port)
        connection.sock = sock  # already connected to the checked address: http.client must not connect
        default_port = 443 if scheme == 'https' else 80
        host_header = (f'[{host}]' if ':' in host else host) + (f':{port}' if port != default_port else '')
        target = (parts.path or '/') + (f'?{parts.query}' if parts.query else '')
        target = urllib.parse.quote(target, safe=_PRINTABLE_ASCII)  # only spaces, controls and non-ASCII
        connection.request(
            'GET',
            target,
            headers={
                'Host': host_header,
                'Accept-Encoding': 'identity',
                'Connection': 'close',
                'User-Agent': 'clipserve',
            },
        )
        response = connection.getresponse()
        if response.status in _REDIRECT_STATUSES:
            return response.status, response.getheader('Location'), b''
        if not 200 <= response.status < 300:
            raise UriError(f'the server answered HTTP {response.status} {response.reason}'.rstrip())
        return response.status, None, _read_body(response, max_bytes)
    finally:
        watchdog.watch(None)  # before closing: the watchdog must never touch a closed (reused) descriptor
        for closable in (response, connection, sock):
            if closable is not None:
                closable.close()


def _read_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body, refused as soon as it is known to exceed max_bytes (chunked bodies included)."""
    length = response.getheader('Content-Length')
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise UriError(f'the remote file is larger than the limit of {max_bytes} bytes')
    chunks, size = [], 0
    while size <= max_bytes:
        chunk = response.read1(min(65536, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > max_bytes:
        raise UriError(f'the remote file is larger than the limit of {max_bytes} bytes')
    return b''.join(chunks)


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order (a module function so tests can replace it)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)))


def connect(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the IP `address` (never a name: names are resolved and checked before)."""
    sock = socket.socket(socket.AF_INET6 if ':' in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _resolve_within(host: str, port: int, seconds: float) -> list[str]:
    """`resolve` in a helper thread, so a slow DNS answer cannot hold the caller past the deadline."""
    result: list = []

    def run():
        try:
            result.append(resolve(host, port))
        except Exception as e:
            result.append(e)

    thread = threading.Thread(target=run, name='clipserve-resolve', daemon=True)
    thread.start()
    thread.join(seconds)
    if not result:
        raise _Timeout()
    if isinstance(result[0], Exception):
        raise UriError(f'cannot resolve host {host!r}: {result[0]}')
    if not result[0]:
        raise UriError(f'cannot resolve host {host!r}: no addresses')
    return result[0]


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """The system's default verifying context, made once (loading the CA store takes tens of ms)."""
    return ssl.create_default_context()


class _Watchdog:
    """Shuts the current socket down when the deadline passes, so no blocked read outlives the timeout.

    A per-read socket timeout does not bound a server that sends one byte at a time; shutting the
    socket down from a timer thread wakes the reader wherever it is (TLS handshake, headers, body).
    """

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.fired:
            raise _Timeout()
        return left

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shutdown()

    def stop(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._stopped = True
            self._sock = None

    def _fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            try:
                # socket.socket's own shutdown, also for an SSLSocket: cut the TCP stream under TLS.
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass
