"""How the clients talk to a gateway's HTTP port: the address, the token, TLS, timeouts, and what httpx's
answers and failures mean. Shared by the sync and async clients, which differ only in how they wait.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

from clipserve_client._version import __version__
from clipserve_client.errors import APIConnectionError, APITimeoutError, UnexpectedAnswerError, status_error
from clipserve_client.inputs import Loader
from clipserve_client.retry import RetryPolicy
from clipserve_client.tls import ssl_context

TOKEN_ENV = 'CLIPSERVE_AUTH_TOKEN'  # the same variable the gateway reads its token from
DEFAULT_SERVER = 'http://127.0.0.1:51001'  # flows/multi-protocol.yml's HTTP port
_JINA_SCHEMES = ('grpc', 'grpcs', 'ws', 'wss', 'websocket', 'websockets')


def base_url(server: str) -> str:
    """`http(s)://host[:port][/prefix]`; a trailing `/v1` (an OpenAI SDK base_url) is accepted and dropped."""
    if not isinstance(server, str):
        raise TypeError(f'server must be a string such as {DEFAULT_SERVER!r}, got {type(server).__name__}')
    parsed = urlparse(server.strip())
    scheme = parsed.scheme.lower()
    if scheme in _JINA_SCHEMES:
        raise ValueError(
            f"{server!r}: this client speaks HTTP to the gateway's OpenAI-compatible routes; give its HTTP port "
            "(e.g. 'http://host:51001'), or use clipserve_client.jina.Client for gRPC and WebSocket"
        )
    if scheme not in ('http', 'https') or not parsed.hostname:
        raise ValueError(f'{server!r} is not a server address: expected http(s)://host:port, e.g. {DEFAULT_SERVER!r}')
    try:
        parsed.port
    except ValueError:
        raise ValueError(f'{server!r} is not a server address: bad port') from None
    if parsed.query or parsed.fragment:
        raise ValueError(f'{server!r} is not a server address: no query or fragment, only scheme://host:port[/path]')
    path = parsed.path.rstrip('/')
    if path.endswith('/v1'):
        path = path[: -len('/v1')]
    return f'{scheme}://{parsed.netloc}{path}'


@dataclass(frozen=True)
class Settings:
    """Everything a client is configured with, checked once."""

    url: str
    token: str | None
    verify: ssl.SSLContext | bool
    timeout: float | None
    retry: RetryPolicy
    loader: Loader
    batch_size: int
    model: str | None

    @classmethod
    def make(
        cls,
        server: str,
        *,
        token: str | None,
        ca_file: str | Path | None,
        timeout: float | None,
        retries: int,
        backoff: float,
        batch_size: int,
        model: str | None,
        fetch_urls: bool,
        fetch_timeout: float,
        max_fetch_bytes: int,
    ) -> Settings:
        url = base_url(server)
        tls = url.startswith('https://')
        if ca_file is not None and not tls:
            raise ValueError(f'ca_file is for TLS; use https:// instead of {url}')
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if timeout is not None and timeout <= 0:
            raise ValueError(f'timeout must be > 0 seconds (or None: no limit), got {timeout}')
        return cls(
            url=url,
            token=token or os.environ.get(TOKEN_ENV) or None,
            verify=ssl_context(ca_file) if tls else True,
            timeout=timeout,
            retry=RetryPolicy(retries=retries, backoff=backoff),
            loader=Loader(fetch_urls=fetch_urls, fetch_timeout=fetch_timeout, max_bytes=max_fetch_bytes),
            batch_size=batch_size,
            model=model,
        )

    def httpx_options(self) -> dict:
        headers = {'User-Agent': f'clipserve-client/{__version__}'}
        if self.token:
            headers['Authorization'] = f'Bearer {self.token}'
        # connecting gets at most 30 s of the timeout: a server that does not accept by then is not there
        timeout = httpx.Timeout(self.timeout, connect=min(self.timeout or 30.0, 30.0))
        return {'base_url': self.url, 'headers': headers, 'verify': self.verify, 'timeout': timeout}

    def __repr__(self) -> str:  # never shows the token
        return f'Settings(url={self.url!r}, token={"set" if self.token else None}, timeout={self.timeout})'


def transport_error(error: httpx.HTTPError, url: str, timeout: float | None) -> Exception:
    """httpx's failure as this package's error; connection failures are retryable, TLS failures are not."""
    if isinstance(error, httpx.ConnectTimeout):
        return APIConnectionError(f'{url}: could not connect within {min(timeout or 30.0, 30.0):g} s')
    if isinstance(error, httpx.TimeoutException):
        return APITimeoutError(
            f"{url}: no answer within {timeout:g} s (the client's timeout=); a big batch on a CPU server may need "
            'a longer timeout or a smaller batch_size'
        )
    if _is_tls_failure(error):
        failure = APIConnectionError(
            f'TLS with {url} failed: {error}. If the server uses a private certificate authority, pass ca_file='
        )
        failure.retryable = False
        return failure
    if isinstance(error, (httpx.ConnectError, httpx.NetworkError, httpx.RemoteProtocolError)):
        return APIConnectionError(f'{url} is unavailable: {type(error).__name__}: {error or "connection lost"}')
    failure = APIConnectionError(f'{url}: {type(error).__name__}: {error}')
    failure.retryable = False
    return failure


def _is_tls_failure(error: BaseException) -> bool:
    seen = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return 'CERTIFICATE_VERIFY_FAILED' in str(error) or 'SSL' in str(error)


def answer_of(response: httpx.Response) -> dict:
    """The JSON object of a successful answer; raises the status's error otherwise."""
    url = str(response.request.url)
    try:
        body = response.json()
    except ValueError:
        body = response.text[:500]
    if response.is_success:
        if not isinstance(body, dict):
            raise UnexpectedAnswerError(f'{url} answered HTTP {response.status_code} without a JSON object: {body!r}')
        return body
    if response.status_code == 404 and not (isinstance(body, dict) and isinstance(body.get('error'), dict)):
        detail = body.get('detail', body) if isinstance(body, dict) else body  # Jina's own 404: {"detail": ...}
        body = {
            'error': {
                'message': f'{detail}. Is this the HTTP port of a clipserve gateway (flows/multi-protocol.yml: '
                '51001) with its OpenAI-compatible routes on?'
            }
        }
    raise status_error(response.status_code, body, response.headers, url=url)
