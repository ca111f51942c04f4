"""The operator's URI policy: which image URIs the server may read, and how.

`data:` URIs are always decoded (they carry their own bytes). Reading local files and fetching
http(s) URLs are server-side actions a client could abuse (file disclosure, SSRF), so each is off
until the operator turns it on.

Local reads can be confined to one directory; only regular files are read, and never more than the
size cap. Remote fetches are made by this module itself rather than urllib, so that the address that
was checked is the address that is connected to: every hop (the URL and each redirect) is resolved
once, every address it resolves to must be public (or allow-listed), and the connection goes to one
of those addresses. Proxy environment variables are ignored: fetches always go direct. One deadline
bounds the whole fetch (resolving, connecting, TLS, headers, redirects and body), and the body is cut
at the size cap.
"""

from __future__ import annotations

import base64
import binascii
import functools
import http.client
import ipaddress
import os
import socket
import ssl
import stat
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes

MAX_REDIRECTS = 5
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_NAT64 = ipaddress.ip_network('64:ff9b::/96')  # RFC 6052: the IPv4 address is the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network('64:ff9b:1::/48')  # RFC 8215: local-use NAT64, never public
_IPV4_COMPATIBLE = ipaddress.ip_network('::/96')  # deprecated ::a.b.c.d
_UNIQUE_LOCAL = ipaddress.ip_network('fc00::/7')
_PRINTABLE_ASCII = ''.join(map(chr, range(0x21, 0x7F)))
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UriError(ValueError):
    """A URI the policy refuses, or one that cannot be read; the message says which and why."""


class _Timeout(Exception):
    """The fetch deadline passed; turned into a UriError naming remote_timeout."""


@dataclass(frozen=True)
class UriPolicy:
    allow_local_files: bool = False
    local_files_root: str | None = None  # when set, only files under this directory are readable
    allow_remote: bool = False
    remote_timeout: float = 10.0  # seconds, for the whole fetch including redirects
    max_bytes: int = 20 * 1024 * 1024  # cap for data: payloads, files and downloads
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)  # host names, addresses or CIDR networks
    #                                         exempt from the non-public address check

    def __post_init__(self):
        _parse_allowed_hosts(self.allowed_hosts)  # a malformed network fails here, at startup, not per request

    def load(self, uri: str) -> bytes:
        """The bytes `uri` points to, or UriError."""
        uri = uri.strip()
        scheme = urllib.parse.urlsplit(uri).scheme.lower() if '://' in uri or uri.startswith('data:') else ''
        if scheme == 'data':
            return decode_data_uri(uri, self.max_bytes)
        if scheme in ('http', 'https'):
            if not self.allow_remote:
                raise UriError(
                    'fetching remote URIs is disabled on this server (the operator can enable it with '
                    'allow_remote_uris); send the image as a blob or data: URI instead'
                )
            return self._fetch(uri)
        if scheme in ('', 'file'):
            if not self.allow_local_files:
                raise UriError(
                    'reading server-side files is disabled on this server (the operator can enable it '
                    'with allow_local_files); send the image as a blob or data: URI instead'
                )
            path = urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if scheme == 'file' else uri
            return self._read_file(path)
        raise UriError(f'unsupported URI scheme {scheme!r}; use data:, or http(s)/files where the operator allows them')

    # -- local files ---------------------------------------------------------------------------

    def _read_file(self, path: str) -> bytes:
        """Read a regular file under the root, at most max_bytes; st_size is not trusted (it is 0 in /proc)."""
        real = Path(os.path.realpath(os.path.expanduser(path)))
        if self.local_files_root is not None:
            root = Path(os.path.realpath(os.path.expanduser(self.local_files_root)))
            if real != root and root not in real.parents:
                raise UriError(f'the file is outside the directory this server may read ({root})')
        try:
            # stat before opening: opening a FIFO blocks and opening a device can have side effects.
            if not stat.S_ISREG(os.stat(real).st_mode):
                raise UriError('not a regular file on the server (directories, devices and pipes are refused)')
            # O_NONBLOCK: should the path have become a FIFO since the stat, open must not block;
            # O_NOFOLLOW: nor may its last component have become a symlink out of the root.
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0))
            with open(fd, 'rb') as f:
                status = os.fstat(f.fileno())
                if not stat.S_ISREG(status.st_mode):
                    raise UriError('not a regular file on the server (directories, devices and pipes are refused)')
                if status.st_size > self.max_bytes:  # believed when it is too large, never when it is small
                    raise UriError(f'the file is larger than the limit of {self.max_bytes} bytes')
                data = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            raise UriError('no such file on the server') from None
        except OSError as e:
            raise UriError(f'cannot read the file on the server: {e.strerror or type(e).__name__}') from None
        if len(data) > self.max_bytes:
            raise UriError(f'the file is larger than the limit of {self.max_bytes} bytes')
        return data

    # -- remote fetches ------------------------------------------------------------------------

    def _fetch(self, url: str) -> bytes:
        """GET `url` under one deadline; any failure, of the policy or of the network, is a UriError."""
        watchdog = _Watchdog(self.remote_timeout)
        try:
            body = self._follow(url, watchdog)
            watchdog.stop()
            if watchdog.fired:  # the socket was cut, so the body may be short
                raise _Timeout()
            return body
        except Exception as e:
            watchdog.stop()
            if watchdog.fired or isinstance(e, (_Timeout, TimeoutError)):
                raise UriError(f'fetching the URI took longer than {self.remote_timeout:g} s') from e
            if isinstance(e, UriError):
                raise
            raise UriError(f'fetching the URI failed: {type(e).__name__}: {e}') from e

    def _follow(self, url: str, watchdog: _Watchdog) -> bytes:
        """Follow redirects ourselves, so each hop is resolved, checked and connected to like the first."""
        for _ in range(MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme not in ('http', 'https'):
                raise UriError(f'redirect to a non-http URI refused: {url}')
            host = _ascii_host(parts.hostname or '')
            try:
                port = parts.port or (443 if scheme == 'https' else 80)
            except ValueError:
                raise UriError(f'invalid port in URL {url!r}') from None
            addresses = self._checked_addresses(host, port, watchdog)
            status, location, body = self._get(scheme, host, port, parts, addresses, watchdog)
            if status not in _REDIRECT_STATUSES:
                return body
            if not location:
                raise UriError(f'the server answered {status} without a Location to redirect to')
            url = urllib.parse.urljoin(url, location.strip())
        raise UriError(f'too many redirects (more than {MAX_REDIRECTS})')

    def _checked_addresses(self, host: str, port: int, watchdog: _Watchdog) -> list[str]:
        """Resolve `host` once; every address must be public, in an allowed network, or the name allowed."""
        addresses = _resolve_within(host, port, watchdog.remaining())
        names, networks = _parse_allowed_hosts(self.allowed_hosts)
        if host.rstrip('.') in names:
            return addresses
        for address in addresses:
            try:
                ip = ipaddress.ip_address(address.split('%')[0])
            except ValueError:
                raise UriError(f'host {host!r} resolves to {address!r}, which is not an IP address') from None
            if any(ip in network for network in networks):
                continue
            reason = non_public_reason(ip)
            if reason is not None:
                raise UriError(
                    f'host {host!r} resolves to the non-public address {ip} ({reason}); the server refuses to '
                    'fetch it (the operator can allow-list it with remote_allowed_hosts)'
                )
        return addresses

    def _get(
        self,
        scheme: str,
        host: str,
        port: int,
        parts: urllib.parse.SplitResult,
        addresses: list[str],
        watchdog: _Watchdog,
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
            return response.status, None, self._read_body(response)
        finally:
            watchdog.watch(None)  # before closing: the watchdog must never touch a closed (reused) descriptor
            for closable in (response, connection, sock):
                if closable is not None:
                    closable.close()

    def _read_body(self, response: http.client.HTTPResponse) -> bytes:
        """The body, refused as soon as it is known to exceed max_bytes (chunked bodies included)."""
        length = response.getheader('Content-Length')
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise UriError(f'the remote file is larger than the limit of {self.max_bytes} bytes')
        chunks, size = [], 0
        while size <= self.max_bytes:
            chunk = response.read1(min(65536, self.max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > self.max_bytes:
            raise UriError(f'the remote file is larger than the limit of {self.max_bytes} bytes')
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


def non_public_reason(ip: str | _IPAddress) -> str | None:
    """Why `ip` is not a public address (e.g. 'loopback'), or None when it is public.

    IPv6 forms that carry an IPv4 address are judged by that address: IPv4-mapped and NAT64
    (64:ff9b::/96) are how IPv4 is reached over IPv6, so the IPv4 address decides; for 6to4, Teredo and
    the deprecated IPv4-compatible form a non-public IPv4 address inside refuses the address too.
    """
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.split('%')[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _embedded_reason('IPv4-mapped', ip.ipv4_mapped)
        if ip in _NAT64:
            return _embedded_reason('NAT64', ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip in _NAT64_LOCAL:
            return 'local-use NAT64 prefix 64:ff9b:1::/48'
        embedded = []
        if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 are judged as themselves
            embedded.append(('IPv4-compatible', ipaddress.IPv4Address(int(ip))))
        if ip.sixtofour is not None:
            embedded.append(('6to4', ip.sixtofour))
        if ip.teredo is not None:
            embedded += [('Teredo server', ip.teredo[0]), ('Teredo client', ip.teredo[1])]
        for form, ipv4 in embedded:
            reason = _embedded_reason(form, ipv4)
            if reason is not None:
                return reason
    return _plain_reason(ip)


def _embedded_reason(form: str, ipv4: ipaddress.IPv4Address) -> str | None:
    reason = _plain_reason(ipv4)
    return None if reason is None else f'{form} form of the {reason} address {ipv4}'


def _plain_reason(ip: _IPAddress) -> str | None:
    if ip.is_unspecified:
        return 'unspecified'
    if ip.is_loopback:
        return 'loopback'
    if ip.is_link_local:
        return 'link-local'
    if ip.is_multicast:
        return 'multicast'
    if isinstance(ip, ipaddress.IPv6Address) and ip in _UNIQUE_LOCAL:
        return 'unique-local'
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return 'site-local'
    if ip.is_private:
        return 'private'
    if ip.is_reserved:
        return 'reserved'
    if not ip.is_global:
        return 'not globally routable'
    return None


def _parse_allowed_hosts(entries: tuple[str, ...]) -> tuple[frozenset[str], tuple]:
    """(host names, networks): an entry that parses as an address or CIDR network is a network."""
    names, networks = set(), []
    for entry in entries:
        entry = str(entry).strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip('[]'), strict=False))
        except ValueError:
            if '/' in entry:
                raise ValueError(f'remote_allowed_hosts: {entry!r} is not a valid address or network') from None
            names.add(_ascii_host(entry).rstrip('.'))
    return frozenset(names), tuple(networks)


def _ascii_host(host: str) -> str:
    """The host name as sent to the resolver and in the Host header (IDNA for non-ASCII names), lower case."""
    if not host:
        raise UriError('the URL has no host')
    try:
        return (host if host.isascii() else host.encode('idna').decode('ascii')).lower()
    except UnicodeError:
        raise UriError(f'invalid host name {host!r}') from None


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


def decode_data_uri(uri: str, max_bytes: int) -> bytes:
    """Decode `data:[<mime>][;base64],<payload>`; raises UriError when malformed or too large."""
    header, sep, payload = uri.partition(',')
    if not sep:
        raise UriError('malformed data: URI (no comma before the payload)')
    # base64 grows data by 4/3; refuse before decoding anything huge.
    if len(payload) > max_bytes * 4 // 3 + 4:
        raise UriError(f'the data: URI is larger than the limit of {max_bytes} bytes')
    if header.endswith(';base64'):
        try:
            return base64.b64decode(''.join(payload.split()), validate=True)
        except (binascii.Error, ValueError) as e:
            raise UriError(f'malformed base64 in data: URI: {e}') from e
    return unquote_to_bytes(payload)
