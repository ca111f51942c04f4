"""Fetching images named by URI (remote URLs, local files) off the model's path, each request within its budget.

Fetches wait on the network or the disk, so they run in their own pool of threads, apart from the
pool that decodes images and from the model's thread: a slow host holds only fetch threads, and only
as many as its request may use. Each request's fetches run in order, at most `concurrency` at once,
and within a budget: a deadline for the whole request's fetching, and a total of bytes. A fetch that
fails or falls outside the budget is that item's failure, never the request's.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class FetchBudget:
    """What one request may spend fetching: seconds from its start, bytes in all, fetches at once."""

    seconds: float = 60.0
    max_bytes: int = 512 * 1024 * 1024
    concurrency: int = 4


class FetchPool:
    """The replica's fetch threads, shared by all requests, each request capped by its budget."""

    def __init__(self, threads: int = 16):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix='clipserve-fetch')

    def request(self, budget: FetchBudget, deadline: float | None = None) -> RequestFetches:
        """A new request's fetch queue; `deadline` (time.monotonic()) shortens the budget's time."""
        ends = time.monotonic() + budget.seconds
        return RequestFetches(self._pool, budget, ends if deadline is None else min(ends, deadline))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class RequestFetches:
    """One request's fetches, started in the order asked for, at most `budget.concurrency` at a time."""

    def __init__(self, pool: ThreadPoolExecutor, budget: FetchBudget, deadline: float):
        self._pool = pool
        self.budget = budget
        self.deadline = deadline
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[[], bytes], Future]] = []
        self._running = 0
        self.fetched_bytes = 0
        self._cancelled = False

    def start(self, fetch: Callable[[], bytes]) -> Future:
        """Queue `fetch()` (returns the bytes); the future gives them, or the reason it failed."""
        future: Future = Future()
        with self._lock:
            self._queue.append((fetch, future))
        self._pump()
        return future

    def cancel(self) -> None:
        """Fail what has not started (the request is over); running fetches end on their own timeouts."""
        with self._lock:
            self._cancelled = True
            queued, self._queue = self._queue, []
        for _, future in queued:
            future.cancel()

    def _pump(self) -> None:
        while True:
            with self._lock:
                if self._cancelled or not self._queue or self._running >= self.budget.concurrency:
                    return
                fetch, future = self._queue.pop(0)
                self._running += 1
            try:
                self._pool.submit(self._run, fetch, future)
            except RuntimeError as error:  # the pool is shut down
                self._finished()
                future.set_exception(error)

    def _run(self, fetch: Callable[[], bytes], future: Future) -> None:
        try:
            if not future.set_running_or_notify_cancel():
                return
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"not fetched: the request's time for fetching images ({self.budget.seconds:g}s) is spent"
                )
            data = fetch()
            with self._lock:
                self.fetched_bytes += len(data)
                over = self.fetched_bytes > self.budget.max_bytes
            if over:
                raise ValueError(
                    f'not fetched: the request fetched more than {self.budget.max_bytes} bytes of images in all'
                )
            future.set_result(data)
        except BaseException as error:  # noqa: BLE001 - every failure is this item's, named in its answer
            if not future.done():
                future.set_exception(error)
        finally:
            self._finished()
            self._pump()

    def _finished(self) -> None:
        with self._lock:
            self._running -= 1
