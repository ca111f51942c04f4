"""Where the server is: `scheme://host[:port]`, with the schemes clip-client accepts."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

# scheme -> (protocol, tls)
_SCHEMES = {
    'grpc': ('grpc', False),
    'grpcs': ('grpc', True),
    'http': ('http', False),
    'https': ('http', True),
    'ws': ('websocket', False),
    'wss': ('websocket', True),
    'websocket': ('websocket', False),
    'websockets': ('websocket', True),
}


@dataclass(frozen=True)
class Address:
    protocol: str  # 'grpc', 'http' or 'websocket'
    host: str
    port: int
    tls: bool

    @property
    def hostport(self) -> str:
        host = f'[{self.host}]' if ':' in self.host else self.host  # IPv6 literal
        return f'{host}:{self.port}'

    def url(self, path: str) -> str:
        """An http(s):// or ws(s):// URL on this server."""
        scheme = {'http': 'http', 'websocket': 'ws'}[self.protocol] + ('s' if self.tls else '')
        return f'{scheme}://{self.hostport}{path}'

    def __str__(self) -> str:
        scheme = {'grpc': 'grpc', 'http': 'http', 'websocket': 'ws'}[self.protocol] + ('s' if self.tls else '')
        return f'{scheme}://{self.hostport}'


def parse_address(server: str) -> Address:
    """Parse a server address; a missing port is 443 with TLS and 80 for plain http/ws (gRPC needs one)."""
    if not isinstance(server, str):
        raise TypeError(f'server must be a string such as "grpc://127.0.0.1:51000", got {type(server).__name__}')
    parsed = urlparse(server.strip())
    scheme = parsed.scheme.lower()
    if scheme not in _SCHEMES:
        raise ValueError(
            f'{server!r} is not a valid server address: the scheme must be one of '
            f'{", ".join(_SCHEMES)} (e.g. "grpc://127.0.0.1:51000")'
        )
    protocol, tls = _SCHEMES[scheme]
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f'{server!r} is not a valid server address: bad port') from None
    if not parsed.hostname:
        raise ValueError(f'{server!r} is not a valid server address: no host')
    if parsed.path not in ('', '/') or parsed.query or parsed.fragment:
        raise ValueError(
            f'{server!r} is not a valid server address: Jina gateways serve at the root, '
            'so give only scheme://host:port'
        )
    if port is None:
        if protocol == 'grpc' and not tls:
            raise ValueError(f'{server!r} has no port (clipserve Flows listen on 51000 by default)')
        port = 443 if tls else 80
    return Address(protocol=protocol, host=parsed.hostname, port=port, tls=tls)
