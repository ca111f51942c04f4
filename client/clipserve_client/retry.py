"""Send one request again after transient failures, waiting longer each time."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from clipserve_client.errors import RetryableError


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # attempts after the first
    backoff: float = 0.5  # seconds before the first retry; doubles each time
    max_backoff: float = 10.0

    def __post_init__(self):
        if self.retries < 0 or self.backoff < 0:
            raise ValueError('retries and backoff must be >= 0')

    def delay(self, attempt: int) -> float:
        """Jittered exponential backoff, so clients that failed together do not retry together."""
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff) * random.uniform(0.5, 1.0)


async def send_with_retry(transport, request, policy: RetryPolicy):
    started = time.monotonic()
    attempt = 1
    while True:
        try:
            return await transport.send(request)
        except RetryableError as err:
            if attempt > policy.retries:
                raise ConnectionError(
                    f'{err} (gave up after {attempt} attempt(s) in {time.monotonic() - started:.1f} s)'
                ) from err
            await asyncio.sleep(policy.delay(attempt))
            attempt += 1
