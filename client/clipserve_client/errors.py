"""The errors the light client raises: one type per cause, so callers catch what they can act on.

HTTP answers in OpenAI's error shape (`{"error": {"message", "type", "param", "code"}}`) become an
`APIStatusError` subclass chosen by status, as the OpenAI SDK does, so code written against either reads
the same. Transport failures are `ConnectionError`s and timeouts `TimeoutError`s (the builtins), so a
caller that does not know this module still catches them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


class ClipServeClientError(Exception):
    """Every error of this package derives from it."""


class FetchError(ClipServeClientError, OSError):
    """An image the client had to read itself (URL, data: URI, file) could not be read."""


class UnexpectedAnswerError(ClipServeClientError, ValueError):
    """A 2xx answer that is not what the route answers (another server on that port, or a proxy's page)."""


class APIConnectionError(ClipServeClientError, ConnectionError):
    """The server could not be reached or the connection broke (refused, reset, TLS failed)."""

    retryable = True


class APITimeoutError(ClipServeClientError, TimeoutError):
    """No answer within the client's `timeout`. Not retried: the server may still be working on it."""

    retryable = False


@dataclass(frozen=True)
class ItemError:
    """One input the server refused: its position in the caller's inputs, its name in the request
    (``input[3].image``), the reason and its code."""

    index: int
    message: str
    param: str = ''
    code: str | None = None


class APIStatusError(ClipServeClientError):
    """The server answered with an error status. `status`, `message`, `type`, `param`, `code` are OpenAI's
    fields; `retry_after` the seconds the server asked to wait (429/503), if it said; `items` the inputs it
    refused, each an ItemError, when it named them (a clipserve server does for bad texts and images)."""

    retryable = False

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        url: str = '',
        items: tuple[ItemError, ...] = (),
    ):
        super().__init__(f'{url + ": " if url else ""}HTTP {status}: {message}')
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after
        self.url = url
        self.items = tuple(items)


class BadRequestError(APIStatusError):
    """400: the request was refused as sent (a bad image, an empty text, a bad parameter)."""


class AuthenticationError(APIStatusError):
    """401: missing or wrong token (`token=` or CLIPSERVE_AUTH_TOKEN)."""


class NotFoundError(APIStatusError):
    """404: an unknown model (the message lists the served ones) or no such route (not a clipserve gateway?)."""


class RequestTooLargeError(APIStatusError):
    """413: over one of the server's size limits (request bytes, image bytes or pixels): send less per request."""


class RateLimitError(APIStatusError):
    """429: the server holds as many requests as it may; retried after Retry-After."""

    retryable = True


class InternalServerError(APIStatusError):
    """5xx: 502, 503 (starting, stopping, overloaded) and 504 (the encoder did not answer in time) are retried."""

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self.status in RETRYABLE_STATUSES


RETRYABLE_STATUSES = (429, 502, 503, 504)
_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: RequestTooLargeError,
    429: RateLimitError,
}


def status_error(status: int, body, headers=None, url: str = '') -> APIStatusError:
    """The error for an answer with `status`: its OpenAI error object if it has one, else its text."""
    error = body.get('error') if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get('message') or '')
        fields = {key: error.get(key) for key in ('type', 'param', 'code')}
    else:
        detail = body.get('detail') if isinstance(body, dict) else None  # Jina's own routes answer {"detail"}
        message, fields = str(detail if detail is not None else body)[:500], {}
    kind = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIStatusError)
    retry_after = parse_retry_after((headers or {}).get('retry-after'))
    items = read_items(error.get('items')) if isinstance(error, dict) else ()
    return kind(status, message or f'HTTP {status}', retry_after=retry_after, url=url, items=items, **fields)


def read_items(value) -> tuple[ItemError, ...]:
    """The `items` of an error answer (the failed inputs, by position); entries that are not such are skipped."""
    items = []
    for entry in value if isinstance(value, list) else ():
        index = entry.get('index') if isinstance(entry, dict) else None
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            code = entry.get('code')
            items.append(
                ItemError(index, str(entry.get('message') or ''), str(entry.get('param') or ''), code and str(code))
            )
    return tuple(items)


def parse_retry_after(value) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from datetime import datetime, timezone
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


_ITEM = re.compile(r'\b(input|documents|candidates)\[(\d+)\]')


def shift_items(error: APIStatusError, offset: int) -> APIStatusError:
    """The same error with `input[i]` renumbered to the caller's position `offset + i`: the server numbers
    the items of one request, and the client sends a long list as several."""
    if not offset:
        return error

    def renumber(text):
        return _ITEM.sub(lambda m: f'{m.group(1)}[{int(m.group(2)) + offset}]', text) if text else text

    shifted = type(error)(
        error.status,
        renumber(error.message),
        type=error.type,
        param=renumber(error.param),
        code=error.code,
        retry_after=error.retry_after,
        url=error.url,
        items=tuple(replace(item, index=item.index + offset, param=renumber(item.param)) for item in error.items),
    )
    return shifted
