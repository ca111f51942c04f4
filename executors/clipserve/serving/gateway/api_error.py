"""OpenAI's error object as the gateway's JSON routes answer it, and the per-item failures it may carry.

OpenAI's shape is `{"error": {"message", "type", "param", "code"}}`. When items of a request failed (a bad
image, an empty text), the error adds `items`: each failed item's position, its parameter name, its reason
and code, so a client sends the others again without reading them out of the message (OpenAI's SDK and
other clients ignore the field; the message still names every item for a person reading it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_POSITION = re.compile(r'^\w+\[(\d+)\]')  # the names the routes give items: input[3], documents[2].image


@dataclass(frozen=True)
class ItemError:
    """One failed item of a request: `param` is its name in the request (input[3].image), `index` its position."""

    param: str
    message: str  # the reason alone, without the name
    code: str | None = None

    @property
    def index(self) -> int | None:
        found = _POSITION.match(self.param)
        return int(found.group(1)) if found else None

    def body(self) -> dict:
        return {'index': self.index, 'param': self.param, 'message': self.message, 'code': self.code}


class APIError(Exception):
    """An answer in OpenAI's error shape with an HTTP status; `items` when items of the request failed."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers=(),
        items: tuple[ItemError, ...] = (),
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = tuple(headers)  # extra (name, value) response headers, e.g. Retry-After
        self.items = tuple(item for item in items if item.index is not None)

    @property
    def type(self) -> str:
        if self.status == 401:
            return 'invalid_request_error'  # as OpenAI answers a wrong key
        return 'server_error' if self.status >= 500 or self.status == 429 else 'invalid_request_error'

    def body(self) -> dict:
        error = {'message': self.message, 'type': self.type, 'param': self.param, 'code': self.code}
        if self.items:
            error['items'] = [item.body() for item in self.items]
        return {'error': error}


def bad_request(message: str, param: str | None = None, code: str | None = 'invalid_value') -> APIError:
    return APIError(400, message, param, code)


def item_error(param: str, reason: str, status: int = 400, code: str | None = 'invalid_value') -> APIError:
    """One item's failure: the message names it (`input[3]: reason`), and `items` carries it."""
    return APIError(status, f'{param}: {reason}', param, code, items=(ItemError(param, reason, code),))


def items_error(failed: list[APIError]) -> APIError:
    """One error for several failed items (each an item_error): a size cap makes it a 413, anything else a 400;
    the first failure's name is the `param`, and its code the code when it is alone."""
    if len(failed) == 1:
        return failed[0]
    items = tuple(item for error in failed for item in error.items)
    too_large = any(error.status == 413 for error in failed)
    message = '; '.join(error.message for error in failed)
    return APIError(
        413 if too_large else 400, message, failed[0].param, 'too_large' if too_large else 'invalid_input', items=items
    )


AUTH_ERROR = APIError(
    401,
    'missing or wrong token: send it as the API key (header "Authorization: Bearer <token>")',
    code='invalid_api_key',
)
