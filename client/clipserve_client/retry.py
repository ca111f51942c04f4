"""When to send a request again and how long to wait first; the sync and async clients only sleep.

Retried: 429 (after the server's Retry-After), 502, 503, 504 and connection failures, with jittered
exponential backoff so that clients that failed together do not retry together. When the retries are
spent, the last error is raised again, its message saying how many attempts were made over how long and
the `retries=` limit that stopped them (the server's own message names its limit, e.g. max_requests).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from clipserve_client.errors import APIStatusError

MAX_RETRY_AFTER = 60.0  # a longer Retry-After is waited for this long at most before the next attempt


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # attempts after the first
    backoff: float = 0.5  # seconds before the first retry; doubles each time
    max_backoff: float = 10.0

    def __post_init__(self):
        if self.retries < 0 or self.backoff < 0:
            raise ValueError('retries and backoff must be >= 0')

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before attempt `attempt + 1`: the backoff, or the server's Retry-After if longer."""
        backoff = min(self.backoff * 2 ** (attempt - 1), self.max_backoff) * random.uniform(0.5, 1.0)
        if retry_after is None:
            return backoff
        return max(backoff, min(retry_after, MAX_RETRY_AFTER))


class Attempts:
    """One request's attempts: `failed(error)` returns the seconds to wait, or raises the final error."""

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.count = 0
        self.started = time.monotonic()

    def failed(self, error: Exception) -> float:
        self.count += 1
        if not getattr(error, 'retryable', False):
            raise error
        if self.count > self.policy.retries:
            raise exhausted(error, self.count, time.monotonic() - self.started, self.policy.retries)
        return self.policy.delay(self.count, getattr(error, 'retry_after', None))


def exhausted(error: Exception, attempts: int, seconds: float, retries: int) -> Exception:
    """The last error, of its own type (a RateLimitError stays one), saying that the retries ran out."""
    note = f"gave up after {attempts} attempt(s) in {seconds:.1f} s (the client's retries={retries})"
    if isinstance(error, APIStatusError):
        final = type(error)(
            error.status,
            f'{error.message} ({note})',
            type=error.type,
            param=error.param,
            code=error.code,
            retry_after=error.retry_after,
            url=error.url,
            items=error.items,
        )
    else:
        final = type(error)(f'{error} ({note})')
    final.attempts = attempts
    final.__cause__ = error
    return final
