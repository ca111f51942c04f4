"""The replica's model thread, and dynamic batching across requests on it.

Every forward pass of a replica runs on one thread (`ModelThread`): callers hand it their rows and
block. OpenMP gives every thread that starts a parallel region its own team of workers, and the math
libraries keep buffers per thread, so one thread rather than a lock around whichever request thread
comes keeps memory flat (eight threads taking turns at a ViT-B-32, torch, CPU: +211 MB and eight
OpenMP workers; the same passes on one thread: +14 MB).

With `max_wait` set, the thread also merges concurrent callers of the same kind (images, texts) into
one forward pass: it takes what is queued (about half of a backlog, but at least half a batch, so the
next batch is ready as soon as this one ends), waits at most `max_wait` for more (only while other
requests are in flight), runs the model once on up to `max_batch` rows and hands each caller back
exactly its own rows, in order. Without it, each call runs alone, first come first served.
Decoding errors never get here (they are per document, before the model), so one client's bad
input cannot fail another client's request.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np


def pad_to(arrays: Sequence[np.ndarray], width: int) -> list[np.ndarray]:
    """Right-pad 2-d token arrays with zeros to `width` columns (for merging trimmed text batches)."""
    return [a if a.shape[1] == width else np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays]


@dataclass(frozen=True)
class Task:
    """One kind of forward pass: `fn` maps row-aligned arrays to [rows, D]; `pad_columns` right-pads
    2-d arrays of different widths (token ids) before merging callers."""

    fn: Callable[..., np.ndarray]
    pad_columns: bool = False


@dataclass
class _Job:
    kind: str
    arrays: tuple
    future: Future

    @property
    def rows(self) -> int:
        return len(self.arrays[0])


class ModelThread:
    """Runs `tasks[kind].fn(*arrays)` for many callers, one forward pass at a time, on one thread."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        max_batch: int,
        max_wait: float | None = None,
        others_in_flight: Callable[[], bool] = lambda: False,
        name: str = 'clipserve-model',
    ):
        self.tasks = dict(tasks)
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.others_in_flight = others_in_flight
        self.batches_run = 0
        self._queue: queue.Queue = queue.Queue()
        self._deferred: collections.deque[_Job] = collections.deque()  # taken off the queue, not yet run
        self._queued_rows = collections.Counter()  # kind -> rows waiting, for sizing a batch out of a backlog
        self._rows_lock = threading.Lock()
        self._closing_lock = threading.Lock()  # a call is queued before the close marker, or refused
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def batching(self) -> bool:
        return self.max_wait is not None

    def __call__(self, kind: str, *arrays: np.ndarray) -> np.ndarray:
        if kind not in self.tasks:
            raise KeyError(f'no task {kind!r}; known: {sorted(self.tasks)}')
        job = _Job(kind, arrays, Future())
        with self._closing_lock:
            if self._closed:
                raise CancelledError('the model thread is closed')
            with self._rows_lock:
                self._queued_rows[kind] += job.rows
            self._queue.put(job)
        return job.future.result()

    def close(self) -> None:
        """Stop: queued calls are cancelled; a forward pass already running finishes first."""
        with self._closing_lock:
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        for job in [*self._deferred, *iter_queue(self._queue)]:
            job.future.cancel()

    # ---- the thread ------------------------------------------------------------------------

    def _dequeued(self, job: _Job) -> _Job:
        with self._rows_lock:
            self._queued_rows[job.kind] -= job.rows
        return job

    def _take(self, kind: str | None, deadline: float | None) -> _Job | None:
        """The next job (of `kind`, when given; others are deferred, in order), waiting until `deadline`
        (None: for ever; raises queue.Empty after it). None once closed."""
        for job in self._deferred:
            if kind is None or job.kind == kind:
                self._deferred.remove(job)
                return job
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            job = self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()
            if job is None:
                self._closed = True
                return None
            self._dequeued(job)
            if kind is None or job.kind == kind:
                return job
            self._deferred.append(job)

    def _collect(self) -> list[_Job]:
        first = self._take(None, None)
        if first is None:
            return []
        jobs, rows = [first], first.rows
        if not self.batching:
            return jobs
        # With a backlog, stop at about half of it, but not below half a batch (double buffering):
        # the rest keeps the model busy while this batch's callers get their answers and send
        # their next requests. Taking all of it left the model idle for a round trip after every
        # batch (4 clients x 8 short texts, onnx: 133 -> 145-149 texts/s).
        waiting = self._queued_rows[first.kind] + sum(j.rows for j in self._deferred if j.kind == first.kind)
        if waiting:
            enough = min(self.max_batch, max(self.max_batch // 2, -(-(rows + waiting) // 2)))
        else:
            enough = self.max_batch
        deadline = time.monotonic() + self.max_wait
        while rows < enough:
            try:
                job = self._take(first.kind, deadline if self.others_in_flight() else time.monotonic())
            except queue.Empty:
                break
            if job is None:
                break
            if rows + job.rows > self.max_batch:
                self._deferred.appendleft(job)  # starts the next batch
                break
            jobs.append(job)
            rows += job.rows
        return jobs

    def _run(self, jobs: list[_Job]) -> None:
        task = self.tasks[jobs[0].kind]
        try:
            columns = list(zip(*(job.arrays for job in jobs)))
            if task.pad_columns and len(jobs) > 1:
                width = max(a.shape[1] for a in columns[0])
                columns = [pad_to(column, width) for column in columns]
            merged = [np.concatenate(column) if len(column) > 1 else column[0] for column in columns]
            out = task.fn(*merged)
            self.batches_run += 1
        except BaseException as error:  # a model failure fails exactly the callers in this batch
            for job in jobs:
                job.future.set_exception(error)
            return
        start = 0
        for job in jobs:
            job.future.set_result(out[start : start + job.rows])
            start += job.rows

    def _loop(self) -> None:
        while not self._closed:
            jobs = self._collect()
            if jobs:
                self._run(jobs)


def iter_queue(q: queue.Queue):
    """What is left in `q` (jobs only), without blocking."""
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return
        if item is not None:
            yield item
