"""The operator's URI policy: which image URIs the server may read, and how.

`data:` URIs are always decoded (they carry their own bytes). Reading local files and fetching
http(s) URLs are server-side actions a client could abuse (file disclosure, SSRF), so each is off
until the operator turns it on; local reads can be confined to one directory, and fetches get a
timeout, a size cap and a refusal of loopback/private/link-local addresses unless allow-listed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes


class UriError(ValueError):
    """A URI the policy refuses, or one that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class UriPolicy:
    allow_local_files: bool = False
    local_files_root: str | None = None       # when set, only files under this directory are readable
    allow_remote: bool = False
    remote_timeout: float = 10.0              # seconds, for the whole fetch
    max_bytes: int = 20 * 1024 * 1024         # cap for data: payloads, files and downloads
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)  # hosts/networks exempt from the address check

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
        real = Path(os.path.realpath(os.path.expanduser(path)))
        if self.local_files_root is not None:
            root = Path(os.path.realpath(os.path.expanduser(self.local_files_root)))
            if real != root and root not in real.parents:
                raise UriError(f'the file is outside the directory this server may read ({root})')
        if not real.is_file():
            raise UriError('no such file on the server')
        if real.stat().st_size > self.max_bytes:
            raise UriError(f'the file is larger than the limit of {self.max_bytes} bytes')
        return real.read_bytes()

    def _check_host(self, url: str) -> None:
        host = urllib.parse.urlsplit(url).hostname or ''
        if host in self.allowed_hosts:
            return
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError as e:
            raise UriError(f'cannot resolve host {host!r}: {e}') from e
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split('%')[0])
            if any(address in ipaddress.ip_network(net, strict=False) for net in self.allowed_hosts if '/' in net):
                continue
            if not address.is_global:
                raise UriError(
                    f'host {host!r} resolves to the non-public address {address}; the server refuses to fetch it '
                    '(the operator can allow-list it)'
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
