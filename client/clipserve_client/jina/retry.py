"""Send one request again after transient failures, waiting longer each time (the light client's policy).

Transient: the transport's RetryableError (nothing listening yet, a reset, 502/503/504, and an overloaded
gateway: gRPC RESOURCE_EXHAUSTED, HTTP 429), and an answer whose executor refused the request because
its replica was full (clipserve's OverloadedError, relayed by Jina in the answer's header). Both wait at
least the Retry-After the server gave. When the retries run out, a transport failure raises
ConnectionError; an overloaded answer is handed on as the answer it is, so it raises ServerError (or goes
to on_error) naming the server's limit, as any executor error does.
"""

from __future__ import annotations

import asyncio
import json
import time

from jina.proto import jina_pb2

from clipserve_client.jina.errors import RetryableError
from clipserve_client.retry import RetryPolicy

__all__ = ['RetryPolicy', 'overload_of', 'send_with_retry']

OVERLOADED = 'OverloadedError'  # clipserve's errors.OverloadedError, by the class name Jina relays


def overload_of(response) -> RetryableError | None:
    """A RetryableError when `response` is a replica's refusal for load, else None."""
    status = response.header.status
    if status.code < jina_pb2.StatusProto.ERROR or status.exception.name != OVERLOADED:
        return None
    args = list(status.exception.args)
    try:
        details = json.loads(args[1]) if len(args) > 1 else {}
    except ValueError:
        details = {}
    seconds = details.get('retry_after') if isinstance(details, dict) else None
    retry_after = float(seconds) if isinstance(seconds, (int, float)) else None
    return RetryableError(f'the server is overloaded: {args[0] if args else ""}', retry_after=retry_after)


async def send_with_retry(transport, request, policy: RetryPolicy):
    started = time.monotonic()
    attempt = 1
    while True:
        try:
            response = await transport.send(request)
        except RetryableError as err:
            if attempt > policy.retries:
                raise ConnectionError(
                    f'{err} (gave up after {attempt} attempt(s) in {time.monotonic() - started:.1f} s)'
                ) from err
            failure = err
        else:
            failure = overload_of(response)
            if failure is None or attempt > policy.retries:
                return response
        await asyncio.sleep(policy.delay(attempt, failure.retry_after))
        attempt += 1
