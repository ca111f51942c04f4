"""The operator's URI policy: which image URIs the server may read, and how.

`data:` URIs are always decoded (they carry their own bytes). Reading local files and fetching
http(s) URLs are server-side actions a client could abuse (file disclosure, SSRF), so each is off
until the operator turns it on. Local reads can be confined to one directory and read only regular
files, never more than the size cap; fetches get a timeout, a size cap and a refusal of non-public
addresses (loopback, private, link-local, ..., also inside IPv6 forms that embed an IPv4 address)
unless allow-listed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
import stat
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes

_NAT64 = ipaddress.ip_network('64:ff9b::/96')             # RFC 6052: the IPv4 address is the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network('64:ff9b:1::/48')     # RFC 8215: local-use NAT64, never public
_IPV4_COMPATIBLE = ipaddress.ip_network('::/96')          # deprecated ::a.b.c.d
_UNIQUE_LOCAL = ipaddress.ip_network('fc00::/7')
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UriError(ValueError):
    """A URI the policy refuses, or one that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class UriPolicy:
    allow_local_files: bool = False
    local_files_root: str | None = None       # when set, only files under this directory are readable
    allow_remote: bool = False
    remote_timeout: float = 10.0              # seconds, for the whole fetch
    max_bytes: int = 20 * 1024 * 1024         # cap for data: payloads, files and downloads
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

    def _check_host(self, url: str) -> None:
        host = urllib.parse.urlsplit(url).hostname or ''
        names, networks = _parse_allowed_hosts(self.allowed_hosts)
        if host.rstrip('.').lower() in names:
            return
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError as e:
            raise UriError(f'cannot resolve host {host!r}: {e}') from e
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split('%')[0])
            if any(address in network for network in networks):
                continue
            reason = non_public_reason(address)
            if reason is not None:
                raise UriError(
                    f'host {host!r} resolves to the non-public address {address} ({reason}); the server refuses to '
                    'fetch it (the operator can allow-list it with remote_allowed_hosts)'
                )

    def _fetch(self, url: str) -> bytes:
        self._check_host(url)
        policy = self

        class _CheckedRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, req, fp, code, msg, headers, newurl):
                if urllib.parse.urlsplit(newurl).scheme not in ('http', 'https'):
                    raise UriError(f'redirect to a non-http URI refused: {newurl}')
                policy._check_host(newurl)
                return super().redirect_request(req, fp, code, msg, headers, newurl)

        opener = urllib.request.build_opener(_CheckedRedirect)
        deadline = time.monotonic() + self.remote_timeout
        chunks, size = [], 0
        try:
            with opener.open(url, timeout=self.remote_timeout) as response:
                # The socket timeout bounds each read; the deadline bounds the whole body, so a
                # server dripping a byte at a time cannot hold a worker for longer than remote_timeout.
                while size <= self.max_bytes:
                    if time.monotonic() > deadline:
                        raise UriError(f'fetching the URI took longer than {self.remote_timeout:g} s')
                    chunk = response.read1(min(65536, self.max_bytes + 1 - size))  # what has arrived
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except UriError:
            raise
        except Exception as e:
            raise UriError(f'fetching the URI failed: {type(e).__name__}: {e}') from e
        if size > self.max_bytes:
            raise UriError(f'the remote file is larger than the limit of {self.max_bytes} bytes')
        return b''.join(chunks)


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
