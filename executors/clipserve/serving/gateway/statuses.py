"""HTTP statuses by error kind on Jina's own HTTP routes (`/post`, `/<endpoint>`).

Jina answers an executor's error with HTTP 200 and the error in the body's `header.status` (its class name
and arguments). That stays so for every error, except two a client must tell apart without reading the
body, because what it should do differs: an overloaded replica (OverloadedError: HTTP 429, `Retry-After`
from the error's details, retry later) and a request past its deadline (DeadlineExceededError: 504). The
body is left as Jina wrote it, so Jina's own HTTP client still reads the error from it. The kind is read
from the header's exception name (errors.kind_named), never from its message.

gRPC and WebSocket answers keep Jina's in-stream error headers: clip-client and Jina's clients read the
error's name and message (which names the limit) from them.
"""

from __future__ import annotations

import json
import math

from clipserve import errors

STATUSES = {errors.OverloadedError: 429, errors.DeadlineExceededError: 504}
_HEADER = b'{"header":'


def error_status(body: bytes) -> tuple[int, list[tuple[bytes, bytes]]] | None:
    """The status (and extra headers) a Jina HTTP answer's body calls for, or None to leave it as it is.
    Only the body's header object is parsed (Jina's response model puts it first)."""
    if not body.startswith(_HEADER):
        return None
    start = len(_HEADER)
    text = body[start : start + 65536].decode('utf-8', 'replace')
    try:
        header, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        try:  # a header longer than the prefix (long stack traces): the whole body
            header, _ = json.JSONDecoder().raw_decode(body[start:].decode('utf-8', 'replace').lstrip())
        except ValueError:
            return None
    exception = ((header or {}).get('status') or {}).get('exception') or {}
    if not isinstance(exception, dict):
        return None
    kind = errors.kind_named(exception.get('name'))
    status = STATUSES.get(kind)
    if status is None:
        return None
    extra = []
    if kind.retryable:
        seconds = errors.details_of(exception.get('args') or []).get('retry_after')
        seconds = seconds if isinstance(seconds, (int, float)) and math.isfinite(seconds) else 1
        extra.append((b'retry-after', str(max(1, math.ceil(seconds))).encode()))
    return status, extra


class ExecutorErrorStatus:
    """ASGI around Jina's HTTP app: a 200 answer whose header carries an overload or a passed deadline gets
    429 (+ Retry-After) or 504 instead, its body unchanged; everything else passes as it is."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope['type'] != 'http' or scope.get('method') != 'POST':
            return await self.app(scope, receive, send)
        held = {}

        async def checking_send(message):
            if message['type'] == 'http.response.start' and message.get('status') == 200:
                held['start'] = message  # until the body says whether it is an error
                return
            if 'start' in held and message['type'] == 'http.response.body':
                start = held.pop('start')
                if not message.get('more_body'):  # Jina's JSON answers come in one piece
                    found = error_status(message.get('body', b''))
                    if found is not None:
                        status, extra = found
                        start = {**start, 'status': status, 'headers': [*start.get('headers', []), *extra]}
                await send(start)
            await send(message)

        await self.app(scope, receive, checking_send)
