"""The operator's URI policy: which image URIs the server may read, and how.

`data:` URIs are always decoded (they carry their own bytes: data_uris.py). Reading local files
(local_files.py) and fetching http(s) URLs (remote.py: resolve once, connect to the checked address,
one deadline; addresses.py: which addresses) are server-side actions a client could abuse (file
disclosure, SSRF), so each is off until the operator turns it on.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from clipserve.inputs import remote
from clipserve.inputs.addresses import parse_allowed_hosts
from clipserve.inputs.data_uris import UriError, decode_data_uri
from clipserve.inputs.local_files import read_file

__all__ = ['UriError', 'UriPolicy', 'decode_data_uri']


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
        parse_allowed_hosts(self.allowed_hosts)  # a malformed network fails here, at startup, not per request

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
            return remote.fetch(uri, self.remote_timeout, self.max_bytes, self.allowed_hosts)
        if scheme in ('', 'file'):
            if not self.allow_local_files:
                raise UriError(
                    'reading server-side files is disabled on this server (the operator can enable it '
                    'with allow_local_files); send the image as a blob or data: URI instead'
                )
            path = urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if scheme == 'file' else uri
            return read_file(path, self.max_bytes, self.local_files_root)
        raise UriError(f'unsupported URI scheme {scheme!r}; use data:, or http(s)/files where the operator allows them')
