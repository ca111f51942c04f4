"""The errors a call can raise besides TypeError/ValueError for bad input and builtin TimeoutError."""

from __future__ import annotations

from jina.excepts import BadServer

from clipserve_client.errors import FetchError

__all__ = ['FetchError', 'RetryableError', 'ServerError']


class ServerError(BadServer):
    """The server answered with an error status (an executor raised). `.response` is the whole answer.

    A subclass of jina's BadServer, which is what clip-client and jina's Client raise.
    """

    def __init__(self, response):
        status = response.header.status
        where = f' (executor {status.exception.executor!r})' if status.exception.executor else ''
        super().__init__(f'the server failed the request{where}: {status.description or status.exception.name}')
        self.response = response


class RetryableError(ConnectionError):
    """A transient failure (nothing listening yet, connection reset, 502/503/504, overloaded): send again,
    after `retry_after` seconds at least when the server said so."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
