"""A thread pool whose queue is ordered by priority: who is decoded next, when decoding is short of threads.

A plain pool runs tasks first come, first served: a one-image request that arrives just after large
requests were given room to decode (engine/room.py) waits for every image they queued before it. Here
each task carries a priority (lowest first; ties first come, first served), and the pipeline gives a
request's images the priority room goes by: rows the request has had so far, then rows it asks for.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Callable


class PriorityPool:
    def __init__(self, workers: int, name: str = 'clipserve-preprocess'):
        self._queue: list[tuple[Any, int, Future, Callable, tuple]] = []  # a heap
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f'{name}_{i}', daemon=True) for i in range(max(1, workers))
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: Any, fn: Callable, *args) -> Future:
        """Run `fn(*args)` on a worker once no task of a lower `priority` waits; its Future gives the result."""
        future: Future = Future()
        with self._changed:
            if self._closed:
                raise RuntimeError('cannot schedule new futures after shutdown')
            heapq.heappush(self._queue, (priority, next(self._order), future, fn, args))
            self._changed.notify()
        return future

    def shutdown(self) -> None:
        """Stop: queued tasks are cancelled; running ones finish."""
        with self._changed:
            self._closed = True
            queued, self._queue = self._queue, []
            self._changed.notify_all()
        for _, _, future, _, _ in queued:
            future.cancel()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if not self._queue:
                    return
                _, _, future, fn, args = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as error:  # the caller reads it from the future
                future.set_exception(error)
            else:
                future.set_result(result)
